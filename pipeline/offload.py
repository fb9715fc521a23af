"""Clang offload bundles, the GPU code HIP stores in an ELF's ``.hip_fatbin`` section.

A section holds one or more bundles back to back, with zero padding between them. A bundle is
plain (magic ``__CLANG_OFFLOAD_BUNDLE__``, then a table of entries) or compressed (``CCOB``: a
header, then a zlib or zstd stream that inflates to a plain bundle). Each entry is one code object
named by an id such as ``hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-``; the host entry is
empty and spelled several ways (``host-x86_64-unknown-linux``, ``host-x86_64-unknown-linux-gnu``).
All integers are little-endian.
"""

from __future__ import annotations

import re
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zstandard

from .errors import RocwheelsError

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
# Of an inflated bundle only its header is kept (magic, count, entry table): the code objects are
# inflated piece by piece and dropped. 4 MiB holds the table of ~50,000 entries.
HEADER_LIMIT = 4 << 20
# Compressed bytes per step: code objects deflate ~100x, so a step inflates to about a megabyte.
_PIECE = 16 << 10

# Given (offset, length) in the section: the caller may drop those bytes from memory (an mmap's pages).
Release = Callable[[int, int], None]


class OffloadBundleError(RocwheelsError):
    """A fat binary that is truncated, garbled or in a format this parser does not know."""


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


def parse_fatbin(data: bytes | memoryview, release: Release | None = None) -> tuple[Bundle, ...]:
    """Every bundle in ``data`` (a ``.hip_fatbin`` section, or a view of it in a mapped file), in order.

    Memory stays small however large the section: plain bundles are read by their headers, and
    compressed ones are inflated piece by piece; ``release`` is told of each bundle once read.
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
                f"padding, found bytes {data[pos:pos + 8].hex(' ')}"
            )
        bundles.append(bundle)
        if release:
            release(bundle.offset, bundle.size)
        pos = _skip_padding(data, bundle.offset + bundle.size)
    return tuple(bundles)


def _at(data: bytes | memoryview, pos: int, magic: bytes) -> bool:
    return bytes(data[pos:pos + len(magic)]) == magic


def gpu_targets(bundles: Iterable[Bundle]) -> tuple[str, ...]:
    """The distinct GPU processors (``gfx90a``, ``gfx942``) the bundles carry code for, sorted."""
    return tuple(sorted({e.processor for b in bundles for e in b.entries if e.processor}))


def _skip_padding(data: bytes, pos: int) -> int:
    match = _NON_ZERO.search(data, pos)
    return match.start() if match else len(data)


def _unpack(layout: struct.Struct, data: bytes, pos: int, where: str, what: str) -> tuple:
    if len(data) - pos < layout.size:
        raise OffloadBundleError(
            f"{where}: truncated at 0x{pos:x}: expected {what} "
            f"({layout.size} bytes), {max(len(data) - pos, 0)} remain"
        )
    return layout.unpack_from(data, pos)


def _read_plain(data: bytes | memoryview, start: int, where: str, length: int | None = None) -> tuple[tuple[BundleEntry, ...], int]:
    """The entries of the plain bundle at ``data[start:]`` and the offset where it ends.

    A plain bundle records no total size: it ends after its last code object. ``length``: the
    size of the whole data when ``data`` holds only its beginning (an inflated bundle's header).
    """
    total = len(data) if length is None else length
    if not _at(data, start, PLAIN_MAGIC):
        raise OffloadBundleError(
            f"{where}: expected magic {PLAIN_MAGIC.decode()!r}, found bytes {bytes(data[start:start + 8]).hex(' ')}"
        )
    pos = start + len(PLAIN_MAGIC)
    (count,) = _unpack(_U64, data, pos, where, "the entry count")
    pos += _U64.size
    if count > (len(data) - pos) // _ENTRY.size:
        raise OffloadBundleError(
            f"{where}: truncated or garbled: {count} entries need at least {count * _ENTRY.size} "
            f"bytes of entry headers, {len(data) - pos} remain"
        )
    entries = []
    for index in range(count):
        offset, size, id_length = _unpack(_ENTRY, data, pos, where, f"the header of entry {index}")
        pos += _ENTRY.size
        if id_length > len(data) - pos:
            raise OffloadBundleError(
                f"{where}: truncated at 0x{pos:x}: entry {index} has an id of "
                f"{id_length} bytes, {len(data) - pos} remain"
            )
        raw_id = bytes(data[pos:pos + id_length])
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


def _read_compressed(data: bytes | memoryview, start: int, release: Release | None = None) -> Bundle:
    where = f"compressed offload bundle at 0x{start:x}"
    _, version = _unpack(_CCOB_VERSION, data, start, where, "the CCOB version")
    header = _CCOB_HEADERS.get(version)
    if header is None:
        raise OffloadBundleError(
            f"{where}: unknown CCOB version {version} (expected {', '.join(map(str, _CCOB_HEADERS))})",
            fix="a newer clang wrote this library; rocwheels needs support for this format",
        )
    fields = _unpack(header, data, start, where, f"the CCOB v{version} header")
    if version == 1:
        _, _, method_id, raw_size, _ = fields
        total = None
    else:
        _, _, method_id, total, raw_size, _ = fields
    method = _METHODS.get(method_id)
    if method is None:
        raise OffloadBundleError(
            f"{where}: unknown compression method {method_id} (expected 0 for zlib or 1 for zstd)"
        )
    payload_start = start + header.size
    if total is None:
        payload_end = len(data)
    elif header.size <= total <= len(data) - start:
        payload_end = start + total
    else:
        raise OffloadBundleError(
            f"{where}: truncated or garbled: the header gives a total size of {total} bytes, "
            f"{len(data) - start} remain"
        )
    with memoryview(data) as view, view[payload_start:payload_end] as payload:
        head, inflated, used = _inflate(method, payload, where,
                                        (lambda offset, length: release(payload_start + offset, length)) if release else None)
    if inflated != raw_size:
        raise OffloadBundleError(f"{where}: inflated to {inflated} bytes, the header says {raw_size}")
    entries, _ = _read_plain(head, 0, f"{where} (inflated)", length=inflated)
    size = header.size + used if total is None else total
    return Bundle(start, size, method, version, entries)


def _inflate(method: str, payload: memoryview, where: str, release: Release | None = None) -> tuple[bytes, int, int]:
    """Inflate the stream at the start of ``payload`` piece by piece: (its first HEADER_LIMIT
    bytes, its inflated size, how many payload bytes it used). ``release`` hears of each piece read."""
    inflater = zlib.decompressobj() if method == "zlib" else zstandard.ZstdDecompressor().decompressobj()
    head = bytearray()
    inflated = used = 0
    try:
        while used < len(payload) and not inflater.eof:
            with payload[used:used + _PIECE] as piece:
                plain = inflater.decompress(piece)
                if release:
                    release(used, len(piece))
                used += len(piece) - len(inflater.unused_data)
            inflated += len(plain)
            if len(head) < HEADER_LIMIT:
                head += plain[:HEADER_LIMIT - len(head)]
    except (zlib.error, zstandard.ZstdError) as exc:
        raise OffloadBundleError(f"{where}: garbled {method} stream: {exc}") from None
    if not inflater.eof:
        raise OffloadBundleError(f"{where}: truncated {method} stream: the data ends before it does")
    return bytes(head), inflated, used
