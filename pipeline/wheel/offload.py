"""Clang offload bundles, the GPU code HIP stores in an ELF's ``.hip_fatbin`` section.

A section holds one or more bundles back to back, with zero padding between them. A bundle is
plain (magic ``__CLANG_OFFLOAD_BUNDLE__``, then a table of entries) or compressed (``CCOB``: a
header, then a zlib or zstd stream that inflates to a plain bundle). Each entry is one code object
named by an id such as ``hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-``; the host entry is
empty and spelled several ways (``host-x86_64-unknown-linux``, ``host-x86_64-unknown-linux-gnu``).
All integers are little-endian.

Only entry tables are read, never the code objects: of a compressed bundle just the start of its
stream is inflated. A zstd decoder writes all it inflates through a window as large as the frame
(a hundred megabytes in a ROCm library), so inflating a whole frame would fill it. CCOB v1 records
no total size: the end of a zstd frame is found from its block headers without inflating it, and
a zlib stream is inflated to its end with the output dropped as it comes (zlib's window is 32 KiB).
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import zstandard

from pipeline.errors import RocwheelsError

PLAIN_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"

_U64 = struct.Struct("<Q")
_ENTRY = struct.Struct("<QQQ")  # offset, size, id length
_CCOB_VERSION = struct.Struct("<4sH")
# magic, version, method, [total size,] uncompressed size, hash: v1 has no total size, so the
# end of a v1 bundle is known only once its stream has been inflated.
_CCOB_HEADERS = {1: struct.Struct("<4sHHIQ"), 2: struct.Struct("<4sHHIIQ"), 3: struct.Struct("<4sHHQQQ")}
_METHODS = {0: "zlib", 1: "zstd"}

# kind-amdgcn-vendor-os[-environment]-target: the environment is empty in current ids
# ("amdhsa--gfx942") and absent in old ones ("hip-amdgcn-amd-amdhsa-gfx906").
_GPU_ID = re.compile(r"[^-]+-amdgcn-[^-]*-[^-]*(?:-[^-]*)?-(gfx.+)")
_NON_ZERO = re.compile(rb"[^\x00]")
# Of a compressed bundle only the start is inflated: as much as holds its header (magic, count,
# entry table), first _TABLE_READ bytes, doubled while the table runs on, up to HEADER_LIMIT (the
# table of ~50,000 entries). The code objects after it are never inflated.
HEADER_LIMIT = 4 << 20
_TABLE_READ = 16 << 10
# zlib: compressed bytes handed over per step, and inflated bytes per read while skipping to the
# end of a v1 bundle (which records no total size).
_PIECE = 16 << 10
_DRAIN = 1 << 20
# zstd frame layout (RFC 8878): magic, the descriptor's content-checksum flag, 3-byte block headers.
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_ZSTD_CHECKSUM_FLAG = 0x04
_ZSTD_BLOCK_HEADER = 3
_ZSTD_RLE_BLOCK = 1
_ZSTD_RESERVED_BLOCK = 3

# Given an offset in the section: everything before it has been read, the caller may drop it from
# memory (an mmap's pages).
Release = Callable[[int], None]
# A section's bytes: read whole, a view of a mapped file, or the inflated start of a compressed bundle.
SectionData = bytes | bytearray | memoryview


class OffloadBundleError(RocwheelsError):
    """A fat binary that is truncated, garbled or in a format this parser does not know."""


class _TruncatedBundle(OffloadBundleError):
    """The data ends before a header does: of an inflated bundle, more of it may need inflating."""


@dataclass(frozen=True)
class BundleEntry:
    """One code object; ``offset`` and ``size`` are relative to the start of its plain bundle."""

    triple_id: str
    offset: int
    size: int

    @property
    def target_id(self) -> str | None:
        """The GPU target with its feature suffixes (``gfx942:sramecc+:xnack-``); None for the host."""
        match = _GPU_ID.fullmatch(self.triple_id)
        return match.group(1) if match else None

    @property
    def processor(self) -> str | None:
        """The GPU processor alone (``gfx942``); None for the host."""
        target = self.target_id
        return target.split(":", 1)[0] if target else None


@dataclass(frozen=True)
class Bundle:
    """One bundle of a fat binary: where it sits in the section and what it holds."""

    offset: int  # in the section
    size: int  # bytes it occupies in the section (compressed size for CCOB)
    compression: str | None  # None, "zlib" or "zstd"
    ccob_version: int | None
    entries: tuple[BundleEntry, ...]


def parse_fatbin(data: SectionData, release: Release | None = None) -> tuple[Bundle, ...]:
    """Every bundle in ``data`` (a ``.hip_fatbin`` section, or a view of it in a mapped file), in order.

    Memory stays small however large the section: plain bundles are read by their headers, of a
    compressed one only the start that holds its header is inflated; ``release`` is told how
    far the section has been read after each bundle and its padding.
    """
    bundles = []
    pos = _skip_padding(data, 0)
    while pos < len(data):
        if _at(data, pos, PLAIN_MAGIC):
            entries, end = _read_plain(data, pos, f"offload bundle at 0x{pos:x}")
            bundle = Bundle(pos, end - pos, None, None, entries)
        elif _at(data, pos, CCOB_MAGIC):
            bundle = _read_compressed(data, pos, release)
        else:
            raise OffloadBundleError(
                f"offload bundle at 0x{pos:x}: expected {PLAIN_MAGIC.decode()!r}, 'CCOB' or zero "
                f"padding, found bytes {data[pos : pos + 8].hex(' ')}"
            )
        bundles.append(bundle)
        pos = _skip_padding(data, bundle.offset + bundle.size)
        if release:
            release(pos)
    return tuple(bundles)


def _at(data: SectionData, pos: int, magic: bytes) -> bool:
    return bytes(data[pos : pos + len(magic)]) == magic


def gpu_targets(bundles: Iterable[Bundle]) -> tuple[str, ...]:
    """The distinct GPU processors (``gfx90a``, ``gfx942``) the bundles carry code for, sorted."""
    return tuple(sorted({e.processor for b in bundles for e in b.entries if e.processor}))


def _skip_padding(data: SectionData, pos: int) -> int:
    match = _NON_ZERO.search(data, pos)
    return match.start() if match else len(data)


def _unpack(layout: struct.Struct, data: SectionData, pos: int, where: str, what: str) -> tuple[Any, ...]:
    if len(data) - pos < layout.size:
        raise _TruncatedBundle(
            f"{where}: truncated at 0x{pos:x}: expected {what} ({layout.size} bytes), {max(len(data) - pos, 0)} remain"
        )
    return layout.unpack_from(data, pos)


def _read_plain(
    data: SectionData, start: int, where: str, length: int | None = None
) -> tuple[tuple[BundleEntry, ...], int]:
    """The entries of the plain bundle at ``data[start:]`` and the offset where it ends.

    A plain bundle records no total size: it ends after its last code object. ``length``: the
    size of the whole data when ``data`` holds only its beginning (an inflated bundle's header).
    """
    total = len(data) if length is None else length
    if not _at(data, start, PLAIN_MAGIC):
        raise OffloadBundleError(
            f"{where}: expected magic {PLAIN_MAGIC.decode()!r}, found bytes {bytes(data[start : start + 8]).hex(' ')}"
        )
    pos = start + len(PLAIN_MAGIC)
    (count,) = _unpack(_U64, data, pos, where, "the entry count")
    pos += _U64.size
    if count > (len(data) - pos) // _ENTRY.size:
        raise _TruncatedBundle(
            f"{where}: truncated or garbled: {count} entries need at least {count * _ENTRY.size} "
            f"bytes of entry headers, {len(data) - pos} remain"
        )
    entries = []
    for index in range(count):
        offset, size, id_length = _unpack(_ENTRY, data, pos, where, f"the header of entry {index}")
        pos += _ENTRY.size
        if id_length > len(data) - pos:
            raise _TruncatedBundle(
                f"{where}: truncated at 0x{pos:x}: entry {index} has an id of "
                f"{id_length} bytes, {len(data) - pos} remain"
            )
        raw_id = bytes(data[pos : pos + id_length])
        pos += id_length
        try:
            triple_id = raw_id.decode("ascii")
        except UnicodeDecodeError:
            raise OffloadBundleError(f"{where}: entry {index} has a garbled id {raw_id[:40]!r}") from None
        if offset + size > total - start:
            raise OffloadBundleError(
                f"{where}: entry {index} ({triple_id}) spans 0x{offset:x}+0x{size:x}, "
                f"past the end of the data (0x{total - start:x} bytes)"
            )
        entries.append(BundleEntry(triple_id, offset, size))
    end = max([pos] + [start + e.offset + e.size for e in entries])
    return tuple(entries), end


def _read_compressed(data: SectionData, start: int, release: Release | None = None) -> Bundle:
    where = f"compressed offload bundle at 0x{start:x}"
    _, version = _unpack(_CCOB_VERSION, data, start, where, "the CCOB version")
    header = _CCOB_HEADERS.get(version)
    if header is None:
        raise OffloadBundleError(
            f"{where}: unknown CCOB version {version} (expected {', '.join(map(str, _CCOB_HEADERS))})",
            fix="a newer clang wrote this library; rocwheels needs support for this format",
        )
    fields = _unpack(header, data, start, where, f"the CCOB v{version} header")
    total: int | None
    if version == 1:
        _, _, method_id, raw_size, _ = fields
        total = None
    else:
        _, _, method_id, total, raw_size, _ = fields
    method = _METHODS.get(method_id)
    if method is None:
        raise OffloadBundleError(f"{where}: unknown compression method {method_id} (expected 0 for zlib or 1 for zstd)")
    payload_start = start + header.size
    if total is None:
        payload_end = len(data)
    elif header.size <= total <= len(data) - start:
        payload_end = start + total
    else:
        raise OffloadBundleError(
            f"{where}: truncated or garbled: the header gives a total size of {total} bytes, {len(data) - start} remain"
        )
    payload_release = (lambda offset: release(payload_start + offset)) if release else None
    try:
        with memoryview(data) as view, view[payload_start:payload_end] as payload:
            if method == "zstd":
                _check_zstd_content_size(payload, raw_size, where)
                with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
                    entries = _read_inflated_table(reader.read, raw_size, method, where)
                # v1 records no total size: its end is found from the frame's block headers.
                used = _zstd_frame_size(payload, where) if total is None else total - header.size
            else:
                inflater = _ZlibReader(payload, payload_release)
                entries = _read_inflated_table(inflater.read, raw_size, method, where)
                used = inflater.drain(raw_size, where) if total is None else total - header.size
    except (zlib.error, zstandard.ZstdError) as exc:
        raise OffloadBundleError(f"{where}: garbled {method} stream: {exc}") from None
    return Bundle(start, header.size + used, method, version, entries)


def _read_inflated_table(
    read: Callable[[int], bytes], raw_size: int, method: str, where: str
) -> tuple[BundleEntry, ...]:
    """The entries of the plain bundle a stream inflates to, from as little of its start as holds
    the entry table: the code objects after it are never inflated."""
    head = bytearray()
    want = min(raw_size, _TABLE_READ)
    while True:
        while len(head) < want and (piece := read(want - len(head))):
            head += piece
        try:
            entries, _ = _read_plain(head, 0, f"{where} (inflated)", length=raw_size)
            return entries
        except _TruncatedBundle:
            if len(head) < want:
                raise OffloadBundleError(
                    f"{where}: truncated {method} stream: it inflates to {len(head)} bytes, the header says {raw_size}"
                ) from None
            if want >= min(raw_size, HEADER_LIMIT):
                if want < raw_size:
                    raise OffloadBundleError(
                        f"{where} (inflated): garbled: its entry table does not end within its "
                        f"first {HEADER_LIMIT} bytes"
                    ) from None
                raise
        want = min(2 * want, raw_size, HEADER_LIMIT)


class _ZlibReader:
    """A zlib stream at the start of ``payload``, inflated a bounded piece per read; ``release``
    hears of each piece of the payload once it has been handed to zlib."""

    def __init__(self, payload: memoryview, release: Release | None) -> None:
        self._payload = payload
        self._release = release
        self._inflater = zlib.decompressobj()
        self._fed = 0  # payload bytes handed to zlib
        self._pending = b""  # handed bytes zlib has not consumed yet (its output was full)
        self._inflated = 0

    def read(self, size: int) -> bytes:
        """Up to ``size`` more inflated bytes; b"" at the end of the stream or of the payload."""
        while not self._inflater.eof:
            if not self._pending:
                if self._fed >= len(self._payload):
                    return b""
                self._pending = bytes(self._payload[self._fed : self._fed + _PIECE])
                self._fed += len(self._pending)
                if self._release:
                    self._release(self._fed)
            plain = self._inflater.decompress(self._pending, size)
            self._pending = self._inflater.unconsumed_tail
            if plain:
                self._inflated += len(plain)
                return plain
        return b""

    def drain(self, raw_size: int, where: str) -> int:
        """Inflate the rest, dropping it (zlib's window is 32 KiB, so memory stays small):
        how many payload bytes the stream takes, checked against its inflated size."""
        while self.read(_DRAIN):
            pass
        if not self._inflater.eof:
            raise OffloadBundleError(f"{where}: truncated zlib stream: the data ends before it does")
        if self._inflated != raw_size:
            raise OffloadBundleError(f"{where}: inflated to {self._inflated} bytes, the header says {raw_size}")
        return self._fed - len(self._inflater.unused_data)


def _check_zstd_content_size(payload: memoryview, raw_size: int, where: str) -> None:
    """The frame header's content size, when it has one (clang's one-shot compression writes it),
    must be the bundle header's uncompressed size."""
    content_size = zstandard.frame_content_size(payload)
    if content_size != zstandard.CONTENTSIZE_UNKNOWN and content_size != raw_size:
        raise OffloadBundleError(
            f"{where}: the zstd frame inflates to {content_size} bytes, the header says {raw_size}"
        )


def _zstd_frame_size(payload: memoryview, where: str) -> int:
    """Bytes the zstd frame at the start of ``payload`` occupies, read from its block headers
    (RFC 8878 3.1.1) without inflating it: inflating would fill a window as large as the frame's
    content, a hundred megabytes in a ROCm library. clang writes one frame per bundle."""
    if bytes(payload[:4]) != _ZSTD_MAGIC:
        raise OffloadBundleError(f"{where}: garbled zstd stream: no zstd frame magic at its start")
    pos = zstandard.frame_header_size(payload)
    checksum = 4 if payload[4] & _ZSTD_CHECKSUM_FLAG else 0
    last = False
    while not last:
        if len(payload) - pos < _ZSTD_BLOCK_HEADER:
            raise OffloadBundleError(f"{where}: truncated zstd stream: the data ends before it does")
        block = int.from_bytes(payload[pos : pos + _ZSTD_BLOCK_HEADER], "little")
        last, kind, size = bool(block & 1), (block >> 1) & 3, block >> 3
        if kind == _ZSTD_RESERVED_BLOCK:
            raise OffloadBundleError(f"{where}: garbled zstd stream: reserved block type at payload offset 0x{pos:x}")
        pos += _ZSTD_BLOCK_HEADER + (1 if kind == _ZSTD_RLE_BLOCK else size)
    end = pos + checksum
    if end > len(payload):
        raise OffloadBundleError(f"{where}: truncated zstd stream: the data ends before it does")
    return end
