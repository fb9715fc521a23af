"""Write a wheel from another at the floor: copy what is unchanged, deflate what changed, in parallel.

A member that is not changed is copied as its compressed bytes (local header and data, as they
are), its RECORD row reused: no inflate, no deflate. A changed member whose deflate blocks were
noted while it was unpacked keeps the bits of the blocks that did not change
(pipeline/wheel/splice.py). Other changed and added members are deflated by a
pool of threads (zlib-ng releases the GIL), a large member in chunks that together form one
valid deflate stream, the scheme pigz uses: each chunk is compressed on its own with the previous
chunk's last 32 KiB as dictionary and ends with a sync flush (byte aligned, not final), the last
chunk finishes the stream; the chunks' CRC-32s are combined. ZIP64 records are written where a
size, an offset or the member count passes the classic limits (or everywhere, on request).
"""

from __future__ import annotations

import base64
import contextlib
import copy
import csv
import errno
import hashlib
import io
import itertools
import os
import struct
import threading
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, overload

from zlib_ng import zlib_ng

from pipeline.errors import RocwheelsError
from pipeline.util.files import atomic_write
from pipeline.wheel.splice import BlockIndex, IndexedInflater, Splice, plan_splice, raw_deflater

_PIECE = 16 << 20  # hashed per thread by piecewise_sha256
CHUNK = 4 << 20  # per deflate job: large enough to keep the ratio, small enough to spread 1 GB over cores
_BEHIND_FROM = 16 << 20  # the least member worth a thread hashing beside its inflating (benchmarks/README.md)
# The most inflated bytes held per step of an inflate, and the compressed bytes read for one: small
# pieces keep memory down (glibc keeps freed megabyte blocks), a quarter of one inflates to about one.
_STEP = 256 << 10
_HEAD = 64  # inflated bytes a member's file type is told by (its magic number)
_WINDOW = 32 << 10  # deflate's dictionary: what a chunk may refer back to in the previous one
_LIMIT = 0xFFFFFFFF
_COUNT_LIMIT = 0xFFFF
_LOCAL = struct.Struct("<IHHHHHIIIHH")
_CENTRAL = struct.Struct("<IHHHHHHIIIHHHHHII")
_EOCD = struct.Struct("<IHHHHIIH")
_EOCD64 = struct.Struct("<IQHHIIQQQQ")
_LOCATOR64 = struct.Struct("<IIQI")
_DESCRIPTOR = 0x08074B50
_ZIP64_EXTRA = 0x0001
_MADE_BY_UNIX = 3 << 8 | 45  # unix attributes, spec version 4.5 (ZIP64)
# The earliest time a zip can hold (1980-01-01 UTC): SOURCE_DATE_EPOCH below it is taken as it, as wheel does.
ZIP_EPOCH = 315532800
T = TypeVar("T")


@dataclass(frozen=True)
class Added:
    """A member that is not in the source wheel (a grafted library): its content and permissions."""

    content: bytes | Path
    mode: int = 0o644


def write_wheel(
    source: Path,
    dest: Path,
    *,
    record: str,
    changed: Mapping[str, bytes | Path] | None = None,
    added: Mapping[str, Added] | None = None,
    dropped: frozenset[str] = frozenset(),
    level: int = 6,
    threads: int | None = None,
    force_zip64: bool = False,
    source_date_epoch: int | None = None,
    sync: bool = True,
    indexes: Mapping[str, BlockIndex] | None = None,
) -> Path:
    """Write ``source`` to ``dest`` (atomically, on disk before it appears unless not ``sync``: a
    wheel that is only an intermediate) with ``changed`` members' new content, ``added``
    members appended, ``dropped`` ones left out and ``record`` (the RECORD member) rewritten last.
    A changed member that ``indexes`` describes (its deflate blocks, noted by
    :func:`extract_members`) has only its changed blocks deflated again.

    Unchanged members keep their bytes, RECORD rows and order, and their time stamps and
    permissions unless ``source_date_epoch`` is given: then every member gets that time and
    :func:`fixed_mode`, so the same contents give the same bytes whenever and wherever they were
    built. ``threads`` deflate in parallel (default: the cores this process may use).
    """
    changed = dict(changed or {})
    added = dict(added or {})
    dest.parent.mkdir(parents=True, exist_ok=True)
    with (
        atomic_write(dest, sync=sync) as out,
        zipfile.ZipFile(source) as archive,
        open(source, "rb") as raw,
    ):
        unknown = set(changed) - set(archive.namelist())
        if unknown:
            raise ValueError(f"not members of {source.name}: {sorted(unknown)}")
        rows = record_rows(archive, record)
        writer = _Writer(out, force_zip64)
        with ThreadPoolExecutor(max_workers=threads or len(os.sched_getaffinity(0))) as pool:
            new_rows: list[tuple[str, str, str]] = []

            def entry(info: zipfile.ZipInfo) -> zipfile.ZipInfo:
                return info if source_date_epoch is None else stamped(info, source_date_epoch)

            # Planned ahead, one member per thread: each reads its file whole (for RECORD's hash).
            splices = {
                member.filename: pool.submit(plan_splice, index, content, source, _data_offset(raw, member), level)
                for member in archive.infolist()
                if isinstance(content := changed.get(member.filename), Path)
                and (index := (indexes or {}).get(member.filename))
                and member.compress_type == zipfile.ZIP_DEFLATED
                and member.compress_size == index.compressed_size
            }
            for member in archive.infolist():
                if member.filename == record or member.filename in dropped:
                    continue
                content = changed.get(member.filename)
                splice = splices[member.filename].result() if member.filename in splices else None
                if content is None:
                    writer.copy(raw, member, entry(member))
                    if not member.is_dir():
                        new_rows.append(rows.get(member.filename) or (member.filename, "", ""))
                elif splice:
                    new_rows.append(writer.splice(raw, member.filename, splice, entry(_like(member))))
                else:
                    new_rows.append(writer.deflate(pool, member.filename, content, entry(_like(member)), level))
            for name, addition in added.items():
                info = zipfile.ZipInfo(name, date_time=_newest(archive))
                info.external_attr = (0o100000 | addition.mode) << 16
                new_rows.append(writer.deflate(pool, name, addition.content, entry(info), level))
            new_rows.append((record, "", ""))
            text = io.StringIO()
            csv.writer(text, lineterminator="\n").writerows(new_rows)
            writer.deflate(pool, record, text.getvalue().encode("utf-8"), entry(_like(archive.getinfo(record))), level)
        writer.finish()
    return dest


def extract_members(
    source: Path,
    names: list[str],
    dest: Path,
    *,
    record: Mapping[str, tuple[str, str, str]],
    check_only: Sequence[str] = (),
    threads: int | None = None,
    indexes: dict[str, BlockIndex] | None = None,
) -> dict[str, Path]:
    """Inflate members ``names`` of the (checked) wheel ``source`` under ``dest``, several at once,
    keeping permission bits; member -> file. CRCs and the hashes and sizes of ``record``'s rows
    are checked on the way (what is inflated anyway is also hashed: a member changed after the
    build is caught). With ``indexes``, the deflate blocks of each deflated member written are
    noted there (member -> index), for :func:`write_wheel` to deflate again only those that change."""
    with zipfile.ZipFile(source) as archive:
        infos = [archive.getinfo(name) for name in names]
        checked = [archive.getinfo(name) for name in check_only]
    written = {info.filename: dest.joinpath(*info.filename.split("/")) for info in infos}
    for target in written.values():
        target.parent.mkdir(parents=True, exist_ok=True)
    # The members repair copies as they are: inflated and hashed only, nothing written.
    indexing = None if indexes is None else _Indexing(indexes, frozenset(written))
    _inflate_all(source, [*infos, *checked], record, lambda info, head: written.get(info.filename), threads, indexing)
    return written


def check_members(
    source: Path,
    infos: Sequence[zipfile.ZipInfo],
    *,
    record: Mapping[str, tuple[str, str, str]],
    threads: int | None = None,
) -> None:
    """Inflate members ``infos`` of the (checked) wheel ``source`` to nothing, several at once, with
    CRCs and ``record``'s hashes and sizes checked as in :func:`extract_members`."""
    _inflate_all(source, infos, record, lambda info, head: None, threads)


def scan_members(
    source: Path,
    infos: Sequence[zipfile.ZipInfo],
    *,
    record: Mapping[str, tuple[str, str, str]],
    select: Callable[[bytes], bool],
    work: Callable[[str, Path], T],
    scratch: Path,
    threads: int | None = None,
) -> dict[str, T]:
    """Inflate each member ``infos`` of the (checked) wheel ``source`` once, several at once, with
    CRCs and ``record``'s hashes and sizes checked as in :func:`extract_members`. A member whose
    first inflated bytes ``select`` accepts is also written to a file in ``scratch``, handed to
    ``work(member, file)`` once its checks pass and removed after, so the disk holds one member
    per thread; member -> what ``work`` returned, in the order of ``infos``. An error of ``work``
    is raised only once every member has passed its checks: a member changed after the build is
    reported before the damage it does."""
    position = {info.filename: index for index, info in enumerate(infos)}
    outcomes: dict[str, tuple[T | None, Exception | None]] = {}

    def file_for(info: zipfile.ZipInfo, head: bytes) -> Path | None:
        return scratch / str(position[info.filename]) if select(head) else None

    def then(info: zipfile.ZipInfo, file: Path) -> None:
        try:
            outcomes[info.filename] = (work(info.filename, file), None)
        except Exception as exc:  # raised below, after every member's checks
            outcomes[info.filename] = (None, exc)
        finally:
            file.unlink()

    _inflate_all(source, infos, record, file_for, threads, then=then)
    ordered = sorted(outcomes.items(), key=lambda item: position[item[0]])
    for _, (_, error) in ordered:
        if error is not None:
            raise error
    return {name: result for name, (result, _) in ordered}  # type: ignore[misc]


def _inflate_all(
    source: Path,
    infos: Sequence[zipfile.ZipInfo],
    record: Mapping[str, tuple[str, str, str]],
    file_for: Callable[[zipfile.ZipInfo, bytes], Path | None],
    threads: int | None,
    indexing: _Indexing | None = None,
    then: Callable[[zipfile.ZipInfo, Path], None] | None = None,
) -> None:
    workers = threads or len(os.sched_getaffinity(0))
    total = sum(info.file_size for info in infos)
    # Largest first: the longest job starts at once. A member larger than a worker's share
    # would leave the others idle: it is hashed and written beside its inflating. Each worker
    # takes the next member when done (no future per member: a wheel may hold ten thousand).
    queue = iter(sorted(infos, key=lambda i: -i.file_size))
    taking = threading.Lock()
    failed = threading.Event()

    def worker() -> None:
        while not failed.is_set():
            with taking:
                info = next(queue, None)
            if info is None:
                return
            try:
                beside = info.file_size >= _BEHIND_FROM and info.file_size * workers > total
                _inflate(source, info, record.get(info.filename, ("", "", "")), file_for, then, beside, indexing)
            except BaseException:
                failed.set()  # one damaged member is enough: the rest need not be read
                raise

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for done in [pool.submit(worker) for _ in range(workers)]:
            done.result()


def _inflate(
    source: Path,
    info: zipfile.ZipInfo,
    row: tuple[str, str, str],
    file_for: Callable[[zipfile.ZipInfo, bytes], Path | None],
    then: Callable[[zipfile.ZipInfo, Path], None] | None,
    beside: bool,
    indexing: _Indexing | None,
) -> None:
    try:
        target = _inflate_checked(source, info, row, file_for, beside, indexing)
    # zlib_ng's stub declares `error` an instance of Exception; at run time it is the class.
    except (zipfile.BadZipFile, zlib_ng.error) as exc:  # type: ignore[misc]
        raise RocwheelsError(
            f"{source}: member {info.filename} is damaged ({exc}): the file changed after it was written",
            fix="do not install, repair or publish this file; build or download the wheel again",
        ) from None
    if target and then:
        then(info, target)


def _inflate_checked(
    source: Path,
    info: zipfile.ZipInfo,
    row: tuple[str, str, str],
    file_for: Callable[[zipfile.ZipInfo, bytes], Path | None],
    beside: bool,
    indexing: _Indexing | None,
) -> Path | None:
    """Inflate ``info`` with its CRC and RECORD ``row`` checked, into the file ``file_for`` names
    once it has seen the first inflated bytes (None: nowhere); that file. Its deflate blocks are
    noted where ``indexing`` says."""
    algorithm, _, _ = row[1].partition("=")
    # A RECORD row's algorithm is checked by check_wheel; one hashlib does not know is not checked here.
    digest = hashlib.new(algorithm) if algorithm in hashlib.algorithms_available else None
    indexer = (
        IndexedInflater()
        if indexing and info.compress_type == zipfile.ZIP_DEFLATED and info.filename in indexing.names
        else None
    )
    with open(source, "rb") as raw:
        pieces = _inflated(raw, info, source, indexer)
        head = b""
        while len(head) < _HEAD and (piece := next(pieces, b"")):
            head += piece
        target = file_for(info, head)
        crc = length = 0
        with target.open("wb") if target else contextlib.nullcontext() as sink:

            def keep(data: bytes) -> None:
                if digest:
                    digest.update(data)
                if sink:
                    sink.write(data)

            # ``beside``: hashed and written a piece behind the inflating, in a thread of its own
            # (both let go of the GIL), for a member that is most of its wheel (benchmarks/README.md).
            with _one_behind(beside) as later:
                for data in itertools.chain((head,), pieces):
                    crc = zlib_ng.crc32(data, crc)
                    length += len(data)
                    later(keep, data)
    if crc != info.CRC or length != info.file_size:
        raise zipfile.BadZipFile(f"{source.name}: {info.filename} fails its CRC check")
    if (digest and row[1] != _format_hash(digest)) or (row[2] and row[2] != str(length)):
        raise RocwheelsError(
            f"{source}: member {info.filename} does not match its RECORD hash or size: it changed after the wheel was built",
            fix="do not install, repair or publish this file; rebuild the wheel from its recipe",
        )
    if indexing and indexer:
        indexing.into[info.filename] = indexer.index()
    if target:
        mode = (info.external_attr >> 16) & 0o777
        target.chmod((mode or 0o644) | 0o600)  # stay writable: the caller may patch it
    return target


def _inflated(
    raw: io.BufferedReader, info: zipfile.ZipInfo, source: Path, indexer: IndexedInflater | None = None
) -> Iterator[bytes]:
    """The inflated bytes of member ``info``, at most ``_STEP`` at a time whatever its compression
    ratio; by ``indexer`` (which notes its blocks) if given."""
    raw.seek(_data_offset(raw, info))
    if info.compress_type not in (zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED):
        raise zipfile.BadZipFile(f"{source.name}: {info.filename} uses compression method {info.compress_type}")
    inflater = zlib_ng.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED and not indexer else None

    def inflate(block: bytes) -> Iterator[bytes]:
        if indexer:
            yield from indexer.decompress(block)
        elif inflater:
            while block:
                data = inflater.decompress(block, _STEP)
                block = inflater.unconsumed_tail
                if data:
                    yield data
        else:
            yield block

    remaining = info.compress_size
    while remaining:
        block = raw.read(min(remaining, _STEP // 4 if indexer or inflater else _STEP))
        if not block:
            raise zipfile.BadZipFile(f"{source.name}: {info.filename} ends early")
        remaining -= len(block)
        yield from inflate(block)
    while inflater and (data := inflater.decompress(b"", _STEP)):
        yield data
    if (indexer and not indexer.eof) or (inflater and not inflater.eof):
        raise zipfile.BadZipFile(f"{source.name}: {info.filename} ends before its deflate stream does")


def _data_offset(raw: io.BufferedReader, info: zipfile.ZipInfo) -> int:
    """Where member ``info``'s data starts in the archive ``raw``: past its local header."""
    raw.seek(info.header_offset)
    name_length, extra_length = _LOCAL.unpack(raw.read(_LOCAL.size))[9:]
    return int(info.header_offset + _LOCAL.size + name_length + extra_length)


@dataclass(frozen=True)
class _Indexing:
    """Which members' deflate blocks to note (see :mod:`pipeline.wheel.splice`), and where."""

    into: dict[str, BlockIndex]
    names: frozenset[str]


def _format_hash(digest: Any) -> str:  # a hashlib object
    return f"{digest.name}={base64.urlsafe_b64encode(digest.digest()).rstrip(b'=').decode('ascii')}"


def record_hash(data: bytes) -> str:
    """``data``'s hash as a RECORD row gives it ("sha256=...")."""
    return _format_hash(hashlib.sha256(data))


@contextmanager
def _one_behind(threaded: bool) -> Iterator[Callable[[Callable[[bytes], None], bytes], None]]:
    """``later(work, data)``: ``work(data)`` in a thread of its own, in order, at most one call
    behind the caller (so at most one block waits in memory); all done on leaving. Without
    ``threaded``, at once."""
    if not threaded:
        yield lambda work, data: work(data)
        return
    with ThreadPoolExecutor(1) as worker:
        pending: list[Future[None]] = []

        def later(work: Callable[[bytes], None], data: bytes) -> None:
            if pending:
                pending.pop().result()
            pending.append(worker.submit(work, data))

        yield later
        if pending:
            pending.pop().result()


def write_stored(dest: Path, files: Mapping[str, tuple[Path, int]], texts: Mapping[str, str]) -> Path:
    """A zip of ``files`` (member -> (file, its known CRC-32)) and ``texts``, all stored: the file
    data is copied by the kernel, not read, for a wheel only unpacked again (auditwheel's analysis)."""
    with open(dest, "w+b") as out:
        writer = _Writer(out, force_zip64=False)
        for name, (path, crc) in files.items():
            writer.store(name, path, crc)
        for name, text in texts.items():
            data = text.encode("utf-8")
            writer.store(name, data, zlib_ng.crc32(data))
        writer.finish()
    return dest


class _Writer:
    """Appends members to ``out`` and keeps what the central directory will say about them."""

    def __init__(self, out: io.BufferedRandom, force_zip64: bool) -> None:
        self.out = out
        self.force_zip64 = force_zip64
        self.central: list[bytes] = []

    def copy(self, raw: io.BufferedReader, member: zipfile.ZipInfo, entry: zipfile.ZipInfo) -> None:
        """Copy ``member``'s local header, data and data descriptor as they are, but for the time
        and permissions of ``entry`` (``member`` itself, or :func:`stamped`)."""
        raw.seek(member.header_offset)
        header = raw.read(_LOCAL.size)
        fields = _LOCAL.unpack(header)
        name_length, extra_length = fields[9], fields[10]
        length = _LOCAL.size + name_length + extra_length + member.compress_size
        if member.flag_bits & 0x08:
            raw.seek(member.header_offset + length)
            signed = struct.unpack("<I", raw.read(4))[0] == _DESCRIPTOR
            zip64 = member.file_size >= _LIMIT or member.compress_size >= _LIMIT
            length += (4 if signed else 0) + (20 if zip64 else 12)
        offset = self.out.tell()
        raw.seek(member.header_offset)
        _copy_range(raw, self.out, length)
        if entry is not member:
            end = self.out.tell()
            self.out.seek(offset + 10)  # the local header's modification time and date
            self.out.write(struct.pack("<HH", *_dos_time(entry)))
            self.out.seek(end)
        self._central_entry(
            entry, member.CRC, member.compress_size, member.file_size, offset, member.flag_bits, member.compress_type
        )

    def store(self, name: str, content: bytes | Path, crc: int) -> None:
        """Write member ``name`` stored, with a CRC-32 known beforehand."""
        size = len(content) if isinstance(content, bytes) else content.stat().st_size
        zip64 = size >= _LIMIT
        encoded = name.encode("utf-8")
        extra = struct.pack("<HHQQ", _ZIP64_EXTRA, 16, size, size) if zip64 else b""
        info = zipfile.ZipInfo(name)
        info.external_attr = (0o100000 | (content.stat().st_mode & 0o777 if isinstance(content, Path) else 0o644)) << 16
        offset = self.out.tell()
        stored_size = _LIMIT if zip64 else size
        self.out.write(
            _LOCAL.pack(
                0x04034B50,
                45 if zip64 else 20,
                0x800,
                zipfile.ZIP_STORED,
                *_dos_time(info),
                crc,
                stored_size,
                stored_size,
                len(encoded),
                len(extra),
            )
            + encoded
            + extra
        )
        if isinstance(content, bytes):
            self.out.write(content)
        else:
            with content.open("rb") as data:
                _copy_range(data, self.out, size)
        self._central_entry(info, crc, size, size, offset, 0x800, zipfile.ZIP_STORED, name=encoded)

    def deflate(
        self,
        pool: ThreadPoolExecutor,
        name: str,
        content: bytes | Path,
        info: zipfile.ZipInfo,
        level: int,
    ) -> tuple[str, str, str]:
        """Write member ``name`` deflated from ``content``; its RECORD row."""
        size = len(content) if isinstance(content, bytes) else content.stat().st_size
        start = self._begin_deflated(name, info, size)
        digest = hashlib.sha256()
        crc = compressed = 0
        for chunk, deflated, chunk_crc in _deflate_chunks(pool, content, level):
            digest.update(chunk)
            crc = zlib_ng.crc32_combine(crc, chunk_crc, len(chunk))
            compressed += len(deflated)
            self.out.write(deflated)
        self._end_deflated(start, info, crc, compressed, size)
        return name, _format_hash(digest), str(size)

    def splice(self, raw: io.BufferedReader, name: str, splice: Splice, info: zipfile.ZipInfo) -> tuple[str, str, str]:
        """Write member ``name`` as ``splice`` says (new bytes, and ranges of its old deflate stream
        in ``raw``); its RECORD row."""
        start = self._begin_deflated(name, info, splice.size)
        for piece in splice.pieces:
            if isinstance(piece, bytes):
                self.out.write(piece)
            else:
                raw.seek(splice.data_offset + piece[0])
                _copy_range(raw, self.out, piece[1])
        self._end_deflated(start, info, splice.crc, splice.compressed_size, splice.size)
        return name, _format_hash(splice.sha256), str(splice.size)

    def _begin_deflated(self, name: str, info: zipfile.ZipInfo, size: int) -> tuple[int, bytes, int, bool]:
        """A deflated member's local header, its CRC and compressed size left to fill in:
        (where it starts, the encoded name, the flags, whether it is ZIP64)."""
        zip64 = self.force_zip64 or size >= _LIMIT - (size >> 6) - 1024  # deflate may grow incompressible data a little
        offset = self.out.tell()
        encoded = name.encode("utf-8")
        flags = 0x800 if encoded != name.encode("ascii", "replace") else 0
        extra = struct.pack("<HHQQ", _ZIP64_EXTRA, 16, size, 0) if zip64 else b""
        self.out.write(
            _LOCAL.pack(
                0x04034B50,
                45 if zip64 else 20,
                flags,
                zipfile.ZIP_DEFLATED,
                *_dos_time(info),
                0,
                _LIMIT if zip64 else 0,
                _LIMIT if zip64 else 0,
                len(encoded),
                len(extra),
            )
        )
        self.out.write(encoded + extra)
        return offset, encoded, flags, zip64

    def _end_deflated(
        self, start: tuple[int, bytes, int, bool], info: zipfile.ZipInfo, crc: int, compressed: int, size: int
    ) -> None:
        offset, encoded, flags, zip64 = start
        end = self.out.tell()
        # Sizes and CRC are known only now: back into the local header (no data descriptor).
        if zip64:
            self.out.seek(offset + 14)
            self.out.write(struct.pack("<I", crc))
            self.out.seek(offset + _LOCAL.size + len(encoded) + 4)
            self.out.write(struct.pack("<QQ", size, compressed))
        else:
            self.out.seek(offset + 14)
            self.out.write(struct.pack("<III", crc, compressed, size))
        self.out.seek(end)
        self._central_entry(info, crc, compressed, size, offset, flags, zipfile.ZIP_DEFLATED, name=encoded)

    def _central_entry(
        self,
        info: zipfile.ZipInfo,
        crc: int,
        compressed: int,
        size: int,
        offset: int,
        flags: int,
        method: int,
        name: bytes | None = None,
    ) -> None:
        encoded = name if name is not None else info.filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
        big = [value for value in (size, compressed, offset) if self.force_zip64 or value >= _LIMIT]
        extra = _without_zip64(info.extra)
        if big:
            extra = struct.pack(f"<HH{len(big)}Q", _ZIP64_EXTRA, 8 * len(big), *big) + extra

        def limited(value: int) -> int:
            return _LIMIT if self.force_zip64 or value >= _LIMIT else value

        self.central.append(
            _CENTRAL.pack(
                0x02014B50,
                _MADE_BY_UNIX,
                45 if big else max(info.extract_version, 20),
                flags,
                method,
                *_dos_time(info),
                crc,
                limited(compressed),
                limited(size),
                len(encoded),
                len(extra),
                0,
                0,
                info.internal_attr,
                info.external_attr,
                limited(offset),
            )
            + encoded
            + extra
        )

    def finish(self) -> None:
        """The central directory, and ZIP64's end records where a limit is passed."""
        start = self.out.tell()
        for entry in self.central:
            self.out.write(entry)
        length = self.out.tell() - start
        count = len(self.central)
        if self.force_zip64 or count >= _COUNT_LIMIT or start >= _LIMIT or length >= _LIMIT:
            end64 = self.out.tell()
            self.out.write(_EOCD64.pack(0x06064B50, _EOCD64.size - 12, 45, 45, 0, 0, count, count, length, start))
            self.out.write(_LOCATOR64.pack(0x07064B50, 0, end64, 1))
            self.out.write(_EOCD.pack(0x06054B50, 0, 0, _COUNT_LIMIT, _COUNT_LIMIT, _LIMIT, _LIMIT, 0))
        else:
            self.out.write(_EOCD.pack(0x06054B50, 0, 0, count, count, length, start, 0))


def _deflate_chunks(
    pool: ThreadPoolExecutor,
    content: bytes | Path,
    level: int,
) -> Iterator[tuple[bytes, bytes, int]]:
    """(chunk, its deflate output, its CRC-32) in order; at most two chunks per thread in flight."""
    pending: deque[tuple[bytes, Future[tuple[bytes, int]]]] = deque()
    window = 2 * (pool._max_workers or 1)
    previous = b""
    for chunk, last in _chunks(content):
        pending.append((chunk, pool.submit(_deflate, chunk, previous[-_WINDOW:], level, last)))
        previous = chunk
        while len(pending) >= window:
            done_chunk, future = pending.popleft()
            yield done_chunk, *future.result()
    while pending:
        done_chunk, future = pending.popleft()
        yield done_chunk, *future.result()


def _deflate(chunk: bytes, dictionary: bytes, level: int, last: bool) -> tuple[bytes, int]:
    compressor = raw_deflater(level, dictionary)
    data = compressor.compress(chunk) + compressor.flush(zlib_ng.Z_FINISH if last else zlib_ng.Z_SYNC_FLUSH)
    return data, zlib_ng.crc32(chunk)


def _chunks(content: bytes | Path) -> Iterator[tuple[bytes, bool]]:
    """``content`` in CHUNK pieces, each with whether it is the last (an empty member is one empty piece)."""
    if isinstance(content, bytes):
        pieces = [content[i : i + CHUNK] for i in range(0, len(content), CHUNK)] or [b""]
        for index, piece in enumerate(pieces):
            yield piece, index == len(pieces) - 1
        return
    with content.open("rb") as data:
        current = data.read(CHUNK)
        while True:
            following = data.read(CHUNK) if len(current) == CHUNK else b""
            yield current, not following
            if not following:
                return
            current = following


def _copy_range(source: io.BufferedReader, sink: io.BufferedIOBase, length: int) -> None:
    sink.flush()
    position = source.tell()
    copied = 0
    try:  # in the kernel, no copy through user space (and reflinks where the file system has them)
        while copied < length:
            done = os.copy_file_range(source.fileno(), sink.fileno(), length - copied, position + copied)
            if not done:
                break
            copied += done
        sink.seek(0, os.SEEK_END)
    except OSError:
        pass
    if copied < length:
        source.seek(position + copied)
        remaining = length - copied
        while remaining:
            block = source.read(min(remaining, 1 << 20))
            if not block:
                raise zipfile.BadZipFile(f"{source.name}: member data ends early")
            sink.write(block)
            remaining -= len(block)


def record_lines(archive: zipfile.ZipFile, record: str) -> Iterator[tuple[int, list[str]]]:
    """RECORD's rows that are not empty, each with the line it ends on, as every stage reads them:
    csv's own line ends (a lone "\r" too), bytes that are not UTF-8 replaced (they then name no member)."""
    rows = csv.reader(io.StringIO(archive.read(record).decode("utf-8", errors="replace"), newline=""))
    try:
        for row in rows:
            if row:
                yield rows.line_num, row
    except csv.Error as exc:  # a field past the csv module's size limit, say
        raise RocwheelsError(
            f"{archive.filename}: {record} line {rows.line_num} is not CSV ({exc})",
            fix="rebuild the wheel; its RECORD is damaged or was not written by a wheel build backend",
        ) from None


def record_rows(archive: zipfile.ZipFile, record: str) -> dict[str, tuple[str, str, str]]:
    """RECORD's rows by member name: (name, "sha256=...", size)."""
    return {row[0]: (row[0], row[1], row[2]) for _, row in record_lines(archive, record) if len(row) == 3}


def _without_zip64(extra: bytes) -> bytes:
    """The extra field without its ZIP64 record (written anew where needed)."""
    kept = bytearray()
    position = 0
    while position + 4 <= len(extra):
        kind, length = struct.unpack_from("<HH", extra, position)
        if kind != _ZIP64_EXTRA:
            kept += extra[position : position + 4 + length]
        position += 4 + length
    return bytes(kept)


def _like(member: zipfile.ZipInfo) -> zipfile.ZipInfo:
    """A fresh entry with ``member``'s name, time stamp and permissions."""
    info = zipfile.ZipInfo(member.filename, date_time=member.date_time)
    info.external_attr = member.external_attr
    return info


def fixed_mode(info: zipfile.ZipInfo) -> int:
    """The external attributes a reproducible wheel gives a member: 0755 where anyone may execute
    it or it is a folder, else 0644 (what the build folder's umask gave it does not count)."""
    mode = info.external_attr >> 16
    if info.is_dir():
        return (0o40755 << 16) | 0x10  # and the MS-DOS folder bit
    return (0o100755 if mode & 0o111 else 0o100644) << 16


def epoch_time(source_date_epoch: int) -> tuple[int, int, int, int, int, int]:
    """SOURCE_DATE_EPOCH as a zip member's time (UTC, from 1980 on)."""
    return time.gmtime(max(source_date_epoch, ZIP_EPOCH))[:6]


def stamped(info: zipfile.ZipInfo, source_date_epoch: int) -> zipfile.ZipInfo:
    """A copy of ``info`` with the time of ``source_date_epoch`` and :func:`fixed_mode`."""
    entry = copy.copy(info)
    entry.date_time = epoch_time(source_date_epoch)
    entry.external_attr = fixed_mode(info)
    return entry


def is_stamped(wheel: Path, source_date_epoch: int) -> bool:
    """Whether every member of ``wheel`` already has the time and permissions :func:`stamped` gives."""
    when = epoch_time(source_date_epoch)
    with zipfile.ZipFile(wheel) as archive:
        return all(i.date_time == when and i.external_attr == fixed_mode(i) for i in archive.infolist())


def _dos_time(info: zipfile.ZipInfo) -> tuple[int, int]:
    year, month, day, hour, minute, second = info.date_time
    return (hour << 11 | minute << 5 | second // 2), ((max(year, 1980) - 1980) << 9 | month << 5 | day)


def _newest(archive: zipfile.ZipFile) -> tuple[int, int, int, int, int, int]:
    """Added members get the newest time stamp of the source (SOURCE_DATE_EPOCH builds stay reproducible)."""
    return max((info.date_time for info in archive.infolist()), default=(1980, 1, 1, 0, 0, 0))


def move_file(source: Path, dest: Path, *, sync: bool = False) -> Path:
    """``source`` to ``dest`` with one rename where they share a file system (a 1 GB wheel is not
    copied again), else copied atomically beside ``dest`` and ``source`` removed. With ``sync``,
    ``source``'s bytes are on disk first (a file written without)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if sync:
        with source.open("rb") as written:
            os.fsync(written.fileno())
    try:
        return source.replace(dest)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
    copy_file(source, dest)
    source.unlink()
    return dest


@overload
def copy_file(source: Path, dest: Path) -> Path: ...
@overload
def copy_file(source: Path, dest: Path, *, fingerprint: str | None) -> Path | None: ...
def copy_file(source: Path, dest: Path, *, fingerprint: str | None = None) -> Path | None:
    """``source`` to ``dest`` atomically, for a wheel that needs no change.

    With ``fingerprint``, only if the bytes copied have that :func:`piecewise_sha256`; else
    nothing is written (None).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        # Into the file atomic_write opened: opening it again by name would truncate it, and ext4
        # then writes the whole file back when it is closed (its guard for files rewritten in place).
        with atomic_write(dest) as copy, open(source, "rb") as data, ThreadPoolExecutor(1) as hasher:
            digest = hasher.submit(piecewise_sha256, source) if fingerprint else None  # while the kernel copies
            _copy_range(data, copy, os.fstat(data.fileno()).st_size)
            if digest and digest.result() != fingerprint:
                raise _OtherBytes
    except _OtherBytes:
        return None
    return dest


class _OtherBytes(Exception):
    """The bytes copied are not the ones asked for: the copy is dropped."""


def piecewise_sha256(path: Path) -> str:
    """The sha256 of the sha256 of each 16 MiB piece of ``path``: as strong a fingerprint as the
    sha256 of the whole file, but hashed on every core (hashlib lets go of the GIL; the gain:
    benchmarks/README.md)."""
    with path.open("rb") as file:
        size = os.fstat(file.fileno()).st_size

        def piece(offset: int) -> bytes:
            digest = hashlib.sha256()
            for start in range(offset, min(offset + _PIECE, size), 1 << 20):
                digest.update(os.pread(file.fileno(), min(1 << 20, offset + _PIECE - start), start))
            return digest.digest()

        with ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0))) as pool:
            pieces = list(pool.map(piece, range(0, size, _PIECE)))
    return hashlib.sha256(b"".join(pieces)).hexdigest()
