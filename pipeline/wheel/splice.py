"""Deflate again only the blocks an edit touched; copy the bits of the others.

Repair changes a few bytes of a library (a search path, a needed library's name), yet deflating
it again costs seconds for the hundreds of megabytes around them. A deflate stream is a run of
blocks, and decoding one needs only its own bits and the 32 KiB of output before it. So while a
member is inflated, every block boundary (a bit of the stream, a byte of the output) and a
checksum of every block's output are noted (:class:`IndexedInflater`: zlib's ``Z_BLOCK`` through
ctypes, as Python's zlib modules do not report boundaries). When the edited file is written back
(:func:`plan_splice`), a run of blocks whose output changed is deflated anew, from its first
block's start to a boundary at least 32 KiB past its last change, so that no block kept refers
back into changed bytes; every other block keeps its bits.

The bits are stitched without shifting them: a kept run lands at the bit position (mod 8) it
had. Before new deflate data an empty stored block pads to a byte; the new data ends in a sync
flush (byte aligned); empty fixed blocks (10 bits each) then reach the next kept run's position,
an even one (a run is extended to a boundary that has one). zlib writes both kinds of empty block
itself (sync and partial flushes), so every inflater reads them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import zipfile
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zlib_ng import zlib_ng

WINDOW = 32 << 10  # the farthest a deflate block refers back
_STEP = 256 << 10  # inflated bytes handed on at a time
_LARGEST_REDONE = 64 << 20  # more to deflate anew than this: the caller deflates the member whole, streamed
_Z_OK, _Z_STREAM_END, _Z_BUF_ERROR, _Z_BLOCK = 0, 1, -5, 5
_AT_BOUNDARY, _IN_LAST_BLOCK = 128, 64  # in data_type: stopped between two blocks; the last block was begun
_EMPTY_STORED_TAIL = b"\0\0\xff\xff"  # LEN 0 and its complement, after the 3 header bits and the padding
_EMPTY_FIXED = (0b010, 10)  # BFINAL 0, BTYPE 01 (fixed codes), then end-of-block (7 zero bits): value, bits


class _Stream(ctypes.Structure):
    """zlib's z_stream on LP64 (zlib-ng's zng_stream has the same fields up to ``data_type``,
    the last one read here, and is not larger)."""

    _fields_ = [
        ("next_in", ctypes.c_void_p),
        ("avail_in", ctypes.c_uint32),
        ("total_in", ctypes.c_size_t),
        ("next_out", ctypes.c_void_p),
        ("avail_out", ctypes.c_uint32),
        ("total_out", ctypes.c_size_t),
        ("msg", ctypes.c_char_p),
        ("state", ctypes.c_void_p),
        ("zalloc", ctypes.c_void_p),
        ("zfree", ctypes.c_void_p),
        ("opaque", ctypes.c_void_p),
        ("data_type", ctypes.c_int),
        ("adler", ctypes.c_ulong),
        ("reserved", ctypes.c_ulong),
    ]


@dataclass(frozen=True)
class InflateLibrary:
    """The C inflate an :class:`IndexedInflater` calls: its name, and its init, inflate and end."""

    name: str
    init: Callable[[Any], int]
    inflate: Callable[[Any, int], int]
    end: Callable[[Any], int]


def _bind(name: str, init: Any, inflate: Any, end: Any, *init_extra: Any) -> InflateLibrary:
    stream = ctypes.POINTER(_Stream)
    inflate.argtypes, end.argtypes = [stream, ctypes.c_int], [stream]
    return InflateLibrary(
        name,
        lambda state: init(ctypes.byref(state), -15, *init_extra),
        lambda state, flush: inflate(ctypes.byref(state), flush),
        lambda state: end(ctypes.byref(state)),
    )


def _zlib_ng() -> InflateLibrary:
    # zlib-ng's Python module links zlib-ng in and exports its native API (zng_*): an inflate
    # twice as fast as the system's zlib here (benchmarks/README.md).
    library = ctypes.CDLL(zlib_ng.__file__)
    init = library.zng_inflateInit2
    init.argtypes = [ctypes.POINTER(_Stream), ctypes.c_int]
    return _bind("zlib-ng", init, library.zng_inflate, library.zng_inflateEnd)


def _system_zlib() -> InflateLibrary:
    library = ctypes.CDLL(ctypes.util.find_library("z") or "libz.so.1")
    library.zlibVersion.restype = ctypes.c_char_p
    init = library.inflateInit2_
    init.argtypes = [ctypes.POINTER(_Stream), ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
    return _bind("zlib", init, library.inflate, library.inflateEnd, library.zlibVersion(), ctypes.sizeof(_Stream))


# In the order tried: zlib-ng's, else the system's zlib.
LIBRARIES: dict[str, Callable[[], InflateLibrary]] = {"zlib-ng": _zlib_ng, "zlib": _system_zlib}


@functools.cache
def inflate_library() -> InflateLibrary:
    """The first of LIBRARIES this machine has (a build of zlib-ng's module may hide its C symbols)."""
    *others, last = LIBRARIES.values()
    for load in others:
        try:
            return load()
        except (OSError, AttributeError):
            continue
    return last()


class DamagedStream(zipfile.BadZipFile):
    """A deflate stream that does not inflate."""


@dataclass(frozen=True)
class BlockIndex:
    """Where a member's deflate blocks begin and what their output was.

    Block ``k`` starts at bit ``bits[k]`` of the stream and byte ``starts[k]`` of the output;
    the last entries of both are the stream's end. ``digests[k]`` is the CRC-32 and Adler-32 of
    block ``k``'s output (a change that keeps both is a chance of 2^-64). ``compressed_crc`` is the
    CRC-32 of the stream itself: an index describes those bytes only.
    """

    starts: array[int]
    bits: array[int]
    digests: array[int]
    compressed_crc: int
    compressed_size: int


def _digest(crc: int, adler: int) -> int:
    return crc << 32 | adler


class IndexedInflater:
    """A raw deflate stream inflated piece by piece, with its :class:`BlockIndex` taken on the way."""

    def __init__(self, library: InflateLibrary | None = None) -> None:
        self._library = library or inflate_library()
        self._stream = _Stream()
        if self._library.init(self._stream) != _Z_OK:
            raise MemoryError("cannot start an inflate")
        self._out = bytearray(_STEP)
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._out))
        self._starts, self._bits, self._digests = array("Q", [0]), array("Q", [0]), array("Q")
        self._crc, self._adler = 0, 1  # of the block being inflated
        self._compressed_crc = self._compressed_size = 0
        self.eof = False

    def __del__(self) -> None:
        self._library.end(self._stream)

    def decompress(self, data: bytes) -> Iterator[bytes]:
        """The output ``data`` (the stream's next bytes) gives, at most 256 KiB at a time."""
        if self.eof:
            if data:
                raise DamagedStream("data after the end of the deflate stream")
            return
        self._compressed_crc = zlib_ng.crc32(data, self._compressed_crc)
        self._compressed_size += len(data)
        stream, view = self._stream, memoryview(self._out)
        keep = ctypes.c_char_p(data)  # next_in points into ``data``, alive as long as this frame
        stream.next_in, stream.avail_in = ctypes.cast(keep, ctypes.c_void_p).value, len(data)
        filled = summed = 0  # output bytes in the buffer; of those, how many are in the block checksums
        while True:
            stream.next_out, stream.avail_out = self._address + filled, _STEP - filled
            result = self._library.inflate(stream, _Z_BLOCK)
            if result not in (_Z_OK, _Z_STREAM_END, _Z_BUF_ERROR):
                raise DamagedStream(f"invalid deflate data ({(stream.msg or b'').decode(errors='replace')})")
            filled = _STEP - stream.avail_out
            if filled > summed:
                piece = view[summed:filled]
                self._crc, self._adler = zlib_ng.crc32(piece, self._crc), zlib_ng.adler32(piece, self._adler)
                summed = filled
            if result == _Z_STREAM_END:
                self._end_block(stream.total_out, stream.total_in * 8)
                self.eof = True
            elif stream.data_type & _AT_BOUNDARY and not stream.data_type & _IN_LAST_BLOCK:
                # (after the last block the stream ends: that boundary is its end, noted above)
                self._end_block(stream.total_out, stream.total_in * 8 - (stream.data_type & 7))
            # No progress with room to write: it needs the stream's next bytes.
            needs_input = result == _Z_BUF_ERROR and stream.avail_out > 0
            if filled and (self.eof or needs_input or filled == _STEP):
                yield bytes(view[:filled])
                filled = summed = 0
            if self.eof:
                if stream.avail_in:
                    raise DamagedStream("data after the end of the deflate stream")
                return
            if needs_input:
                if stream.avail_in:
                    raise DamagedStream("inflate made no progress")
                return

    def _end_block(self, output: int, bit: int) -> None:
        if (output, bit) == (self._starts[-1], self._bits[-1]):
            return  # stopped twice at the same boundary
        self._starts.append(output)
        self._bits.append(bit)
        self._digests.append(_digest(self._crc, self._adler))
        self._crc, self._adler = 0, 1

    def index(self) -> BlockIndex:
        """The stream's blocks, once it has ended."""
        if not self.eof:
            raise DamagedStream("the deflate stream has not ended")
        return BlockIndex(self._starts, self._bits, self._digests, self._compressed_crc, self._compressed_size)


@dataclass(frozen=True)
class Splice:
    """A member written back from its old deflate stream: ``pieces`` are new bytes, or (offset,
    length) of the old stream's bytes, in order; what RECORD and the zip headers say of it."""

    pieces: tuple[bytes | tuple[int, int], ...]
    data_offset: int  # of the old stream in its wheel
    size: int
    crc: int
    sha256: Any  # the hashlib object of the new content
    compressed_size: int
    redone: int  # output bytes deflated anew


class _BitSink:
    """Deflate bits written least significant first, as pieces (see :class:`Splice`)."""

    def __init__(self, read_byte: Callable[[int], int]) -> None:
        self.read_byte = read_byte
        self.pieces: list[bytes | tuple[int, int]] = []
        self.pending, self.count = 0, 0  # bits not yet in a whole byte

    def bits(self, value: int, count: int) -> None:
        self.pending |= value << self.count
        self.count += count
        while self.count >= 8:
            self._bytes(bytes([self.pending & 0xFF]))
            self.pending >>= 8
            self.count -= 8

    def byte_aligned(self, data: bytes) -> None:
        if self.count:
            self.bits(0, 8 - self.count)
        self._bytes(data)

    def old(self, start: int, end: int) -> None:
        """Bits ``start`` to ``end`` of the old stream, which land at the bit position (mod 8) they had."""
        assert start % 8 == self.count, "a kept run must land where its bits lay"
        if start == end:
            return
        first, last = start // 8, end // 8
        low = (1 << self.count) - 1
        if first == last:
            self.pending = (self.pending & low) | (self.read_byte(first) & ((1 << (end % 8)) - 1) & ~low)
            self.count = end % 8
            return
        if self.count:
            self._bytes(bytes([(self.pending & low) | (self.read_byte(first) & ~low & 0xFF)]))
            first += 1
        if last > first:
            self.pieces.append((first, last - first))
        self.pending, self.count = (self.read_byte(last) & ((1 << (end % 8)) - 1), end % 8) if end % 8 else (0, 0)

    def close(self) -> None:
        if self.count:
            self._bytes(bytes([self.pending]))
            self.pending = self.count = 0

    def _bytes(self, data: bytes) -> None:
        if self.pieces and isinstance(self.pieces[-1], bytes) and len(self.pieces[-1]) < _STEP:
            self.pieces[-1] += data
        else:
            self.pieces.append(data)


def plan_splice(index: BlockIndex, edited: Path, wheel: Path, data_offset: int, level: int) -> Splice | None:
    """How to write ``edited`` in place of the deflate stream at ``data_offset`` of ``wheel``,
    which ``index`` describes, with only the changed blocks deflated anew (at ``level``); None
    when the bytes there are not the ones indexed, or when most of it changed (deflate it whole)."""
    with wheel.open("rb") as source:
        if _stream_crc(source, data_offset, index.compressed_size) != index.compressed_crc:
            return None
        with edited.open("rb") as new:
            size, crc, sha256, dirty = _compare(index, new)
            runs = _runs(index, dirty)
            redone = sum(min(size, _output_end(index, end, size)) - index.starts[first] for first, end in runs)
            if redone > _LARGEST_REDONE and redone * 2 > size:
                return None
            sink = _BitSink(lambda offset: os.pread(source.fileno(), 1, data_offset + offset)[0])
            blocks = len(index.digests)
            kept_from = 0  # bit of the old stream where the next kept run starts
            for first, end in runs:
                sink.old(kept_from, index.bits[first])
                sink.bits(0, 3)  # an empty stored block: header (BFINAL 0, BTYPE 00), padding, LEN, NLEN
                sink.byte_aligned(_EMPTY_STORED_TAIL)
                sink.byte_aligned(
                    _deflated(new, index.starts[first], _output_end(index, end, size), level, last=end == blocks)
                )
                if end < blocks:
                    for _ in range(index.bits[end] % 8 // 2):
                        sink.bits(*_EMPTY_FIXED)
                    kept_from = index.bits[end]
            if not runs or runs[-1][1] < blocks:
                sink.old(kept_from, index.bits[-1])
            sink.close()
    pieces = tuple(sink.pieces)
    compressed = sum(len(piece) if isinstance(piece, bytes) else piece[1] for piece in pieces)
    return Splice(pieces, data_offset, size, crc, sha256, compressed, redone)


def _stream_crc(source: Any, offset: int, length: int) -> int:
    crc = 0
    source.seek(offset)
    while length:
        data = source.read(min(length, 1 << 20))
        if not data:
            return -1
        crc = zlib_ng.crc32(data, crc)
        length -= len(data)
    return crc


def _compare(index: BlockIndex, new: Any) -> tuple[int, int, Any, list[bool]]:
    """(size, CRC-32, sha256) of the edited file ``new``, and which of the old blocks differ in it.

    When the size changed, the last block differs too: it ends the stream, and the stream now
    ends elsewhere."""
    size = os.fstat(new.fileno()).st_size
    sha256, crc = hashlib.sha256(), 0
    dirty = []
    starts, digests = index.starts, index.digests
    for block, digest in enumerate(digests):
        data = new.read(starts[block + 1] - starts[block])
        sha256.update(data)
        crc = zlib_ng.crc32(data, crc)
        dirty.append(
            len(data) != starts[block + 1] - starts[block]
            or _digest(zlib_ng.crc32(data), zlib_ng.adler32(data)) != digest
        )
    while data := new.read(1 << 20):  # what an edit appended
        sha256.update(data)
        crc = zlib_ng.crc32(data, crc)
    if size != starts[-1] and dirty:
        dirty[-1] = True
    return size, crc, sha256, dirty


def _runs(index: BlockIndex, dirty: list[bool]) -> list[tuple[int, int]]:
    """(first block, end) of each run to deflate anew: ``end`` is the block where the old bits
    resume (at least WINDOW past the run's last changed byte, at an even bit), or the number of
    blocks when the run goes to the end."""
    runs = []
    blocks = len(dirty)
    block = 0
    while block < blocks:
        if not dirty[block]:
            block += 1
            continue
        first = last = block
        end = block + 1
        while end < blocks:
            if dirty[end]:
                last = end
            elif index.starts[end] >= index.starts[last + 1] + WINDOW and index.bits[end] % 2 == 0:
                break
            end += 1
        runs.append((first, end))
        block = end
    return runs


def _output_end(index: BlockIndex, end: int, size: int) -> int:
    return size if end == len(index.digests) else index.starts[end]


def raw_deflater(level: int, dictionary: bytes) -> Any:
    """A zlib-ng compressor of raw deflate data (no header) that may refer back into ``dictionary``,
    the output just before it."""
    return zlib_ng.compressobj(
        level,
        zlib_ng.DEFLATED,
        -15,
        zlib_ng.DEF_MEM_LEVEL,
        zlib_ng.Z_DEFAULT_STRATEGY,
        **({"zdict": dictionary} if dictionary else {}),
    )


def _deflated(new: Any, start: int, end: int, level: int, *, last: bool) -> bytes:
    """Bytes ``start`` to ``end`` of ``new`` deflated, with the 32 KiB before them as dictionary;
    ending the stream when ``last``, else with a sync flush (byte aligned, not final)."""
    before = max(0, start - WINDOW)
    compressor = raw_deflater(level, os.pread(new.fileno(), start - before, before))
    out = []
    position = start
    while position < end:
        data = os.pread(new.fileno(), min(end - position, 4 << 20), position)
        if not data:
            raise OSError(f"{new.name} ended while it was read")
        out.append(compressor.compress(data))
        position += len(data)
    out.append(compressor.flush(zlib_ng.Z_FINISH if last else zlib_ng.Z_SYNC_FLUSH))
    return b"".join(out)
