"""The measured work that is Python code rather than a command: run in a child process by measure.py.

python tasks.py copy WHEEL OUT_DIR
python tasks.py rewrite WHEEL OUT_DIR        read every member, write a new zip at deflate 6
python tasks.py repair WHEEL OUT_DIR LOG     pipeline.repair.repair.repair_wheel with its defaults
python tasks.py floor WHEEL OUT_DIR CHANGED LEVEL CHUNK
                                             the members named in CHANGED inflated and deflated again
python tasks.py read WHEEL                   every ELF member inflated up to its dynamic section, to nothing
python tasks.py analyze WHEEL                pipeline.wheel.analyze.analyze_wheel
python tasks.py pip-install WHEEL SCRATCH CODE
                                             python -m venv, pip install WHEEL, python -c CODE
python tasks.py bigwheel WHEEL OUT BYTES     BYTES of data, then copies of WHEEL's packages (ZIP64)
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import zipfile
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

REWRITE_LEVEL = 6
ZIP_DATE = (2024, 1, 1, 0, 0, 0)
CHUNK = 1 << 20
BIG_COPIES = 3  # of the generated wheel's packages in the ZIP64 wheel: 3 x 88 ELF files, 3 x ~7,400 members


def copy(wheel: Path, out: Path) -> None:
    shutil.copyfile(wheel, out / wheel.name)


def rewrite(wheel: Path, out: Path) -> None:
    """The floor for any tool that re-compresses a wheel: streamed, so memory stays small."""
    with (
        zipfile.ZipFile(wheel) as source,
        zipfile.ZipFile(out / wheel.name, "w", zipfile.ZIP_DEFLATED, compresslevel=REWRITE_LEVEL) as dest,
    ):
        for member in source.infolist():
            info = zipfile.ZipInfo(member.filename, member.date_time)
            info.external_attr = member.external_attr
            info.compress_type = zipfile.ZIP_DEFLATED
            info.file_size = member.file_size  # announces ZIP64 for members over 2 GiB
            with source.open(member) as data, dest.open(info, "w") as sink:
                shutil.copyfileobj(data, sink, CHUNK)


def repair(wheel: Path, out: Path, log: Path) -> None:
    from pipeline.repair.repair import repair_wheel
    from pipeline.util.log import setup_logging

    setup_logging()  # the "repaired ... (auditwheel x s, RPATHs ..., write ...)" line, parsed by run.py
    repair_wheel(wheel, out, log_file=log)  # default RepairSettings: the ROCm excludes only


def floor(wheel: Path, out: Path, changed_list: Path, level: int, chunk: int) -> None:
    """The floor of a repair (issue #25): every member it changes inflated and deflated again on
    all cores, with the deflate repair uses (zlib-ng at its level, in its chunks, each with the
    previous chunk's last 32 KiB as dictionary); the other members' compressed bytes copied as
    they lie, and the central directory. No analysis, no RPATH, no RECORD hashes: a lower bound."""
    from zlib_ng import zlib_ng

    changed = set(changed_list.read_text().splitlines())
    cores = len(os.sched_getaffinity(0))
    with zipfile.ZipFile(wheel) as archive:
        members = sorted(archive.infolist(), key=lambda info: info.header_offset)
        directory = archive.start_dir
    ends = [info.header_offset for info in members[1:]] + [directory]

    def deflate(piece: bytes, dictionary: bytes, last: bool) -> tuple[bytes, int]:
        compressor = zlib_ng.compressobj(
            level,
            zlib_ng.DEFLATED,
            -15,
            zlib_ng.DEF_MEM_LEVEL,
            zlib_ng.Z_DEFAULT_STRATEGY,
            **({"zdict": dictionary} if dictionary else {}),
        )
        flush = zlib_ng.Z_FINISH if last else zlib_ng.Z_SYNC_FLUSH
        return compressor.compress(piece) + compressor.flush(flush), zlib_ng.crc32(piece)

    def refill(info: zipfile.ZipInfo, deflaters: ThreadPoolExecutor) -> list[Future[tuple[bytes, int]]]:
        """Inflate ``info`` (one stream: one thread), handing each CHUNK to the deflaters as it comes."""
        with wheel.open("rb") as raw:
            raw.seek(info.header_offset + 26)
            name_length, extra_length = int.from_bytes(raw.read(2), "little"), int.from_bytes(raw.read(2), "little")
            raw.seek(name_length + extra_length, os.SEEK_CUR)
            inflater = zlib_ng.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
            parts: list[Future[tuple[bytes, int]]] = []
            pending, previous, emitted, left = b"", b"", 0, info.compress_size
            while left or pending:
                block = raw.read(min(left, CHUNK)) if left else b""
                left -= len(block)
                pending += inflater.decompress(block) if inflater else block
                while len(pending) >= chunk or (pending and not left):
                    piece, pending = pending[:chunk], pending[chunk:]
                    emitted += len(piece)
                    parts.append(deflaters.submit(deflate, piece, previous[-(32 << 10) :], emitted == info.file_size))
                    previous = piece
        return parts

    with (
        ThreadPoolExecutor(cores) as inflaters,
        ThreadPoolExecutor(cores) as deflaters,
        wheel.open("rb") as source,
        (out / wheel.name).open("wb") as sink,
    ):
        jobs = {
            info.filename: inflaters.submit(refill, info, deflaters) for info in members if info.filename in changed
        }
        for info, end in zip(members, ends, strict=True):
            if info.filename in jobs:
                for part in jobs[info.filename].result():
                    sink.write(part.result()[0])
            else:
                _copy_range(source, sink, info.header_offset, end)
        _copy_range(source, sink, directory, wheel.stat().st_size)


# An ELF header's (e_machine, e_phoff, e_phentsize, e_phnum) and a program header's (p_type,
# p_offset, p_filesz), by (ELF class, byte order) as e_ident gives them.
_ELF_HEADER = {(2, 1): "<18xH12xQ14xHH", (2, 2): ">18xH12xQ14xHH", (1, 1): "<18xH8xI10xHH", (1, 2): ">18xH8xI10xHH"}
_PROGRAM_HEADER = {(2, 1): "<I4xQ16xQ", (2, 2): ">I4xQ16xQ", (1, 1): "<II8xI", (1, 2): ">II8xI"}
_PT_DYNAMIC, _EM_AMDGPU = 2, 224


def _dynamic_end(head: bytes) -> int | None:
    """How far into an ELF file starting with ``head`` a reader must go for its dynamic section
    (0: it has none, or is a GPU code object, which no loader reads); None while ``head`` is too
    short to tell."""
    if len(head) < 64:
        return None
    kind = (head[4], head[5])
    if kind not in _ELF_HEADER:
        return 0
    machine, phoff, phentsize, phnum = struct.unpack_from(_ELF_HEADER[kind], head)
    if machine == _EM_AMDGPU:
        return 0
    if len(head) < phoff + phnum * phentsize:
        return None
    ends = [
        offset + size
        for index in range(phnum)
        for kind_of, offset, size in [struct.unpack_from(_PROGRAM_HEADER[kind], head, phoff + index * phentsize)]
        if kind_of == _PT_DYNAMIC
    ]
    return max(ends, default=0)


def read(wheel: Path) -> None:
    """The least any repair reads, which the floor leaves out: which members change it learns from
    each ELF file's dynamic section (NEEDED, RPATH), which lies past the file's code. So every
    member's first bytes are inflated, and an ELF member's up to the end of its dynamic segment, on
    all cores, to nothing: no hashes, no files written."""
    from zlib_ng import zlib_ng

    with zipfile.ZipFile(wheel) as archive:
        queue = iter(sorted((i for i in archive.infolist() if not i.is_dir()), key=lambda i: -i.file_size))
    taking = threading.Lock()

    def inflate(info: zipfile.ZipInfo, raw: io.BufferedReader) -> None:
        raw.seek(info.header_offset + 26)
        name_length, extra_length = struct.unpack("<HH", raw.read(4))
        raw.seek(name_length + extra_length, os.SEEK_CUR)
        inflater = zlib_ng.decompressobj(-15) if info.compress_type == zipfile.ZIP_DEFLATED else None
        head, end, done, left = b"", None, 0, info.compress_size
        while left and (end is None or done < end):
            block = raw.read(min(left, CHUNK))
            left -= len(block)
            data = inflater.decompress(block) if inflater else block
            done += len(data)
            if end is None:
                head += data[: 1 << 16]
                if len(head) >= 4 and not head.startswith(b"\x7fELF"):
                    return
                end = _dynamic_end(head)

    def worker() -> None:
        with wheel.open("rb") as raw:
            while True:
                with taking:
                    info = next(queue, None)
                if info is None:
                    return
                inflate(info, raw)

    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        for done in [pool.submit(worker) for _ in range(len(os.sched_getaffinity(0)))]:
            done.result()


def _copy_range(source: io.BufferedReader, sink: io.BufferedWriter, start: int, end: int) -> None:
    """Bytes [start, end) of ``source`` appended to ``sink``, in the kernel."""
    sink.flush()
    while start < end:
        copied = os.copy_file_range(source.fileno(), sink.fileno(), end - start, start)
        if not copied:
            raise OSError(f"copy_file_range stopped at {start} of {end}")
        start += copied
    sink.seek(0, os.SEEK_END)


def pip_install(wheel: Path, scratch: Path, code: str) -> None:
    """The smoke test as a user makes it by hand: a venv (with pip), pip install, the import."""
    with tempfile.TemporaryDirectory(prefix="pip-install-", dir=scratch) as folder:
        python = Path(folder) / "venv" / "bin" / "python"
        subprocess.run([sys.executable, "-m", "venv", python.parent.parent], check=True)
        subprocess.run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", wheel], check=True)
        subprocess.run([python, "-c", code], check=True, cwd=folder)


def analyze(wheel: Path) -> None:
    from pipeline.wheel.analyze import TargetLayout, analyze_wheel

    analysis = analyze_wheel(wheel, TargetLayout())
    targets = sorted({t for member in analysis.members for t in member.gpu_targets})
    bundles = sum(member.bundles for member in analysis.members)
    print(f"analyzed {len(analysis.members)} ELF members, {bundles} offload bundles, GPU targets {', '.join(targets)}")


def bigwheel(source: Path, out: Path, size: str) -> None:
    """The ZIP64 wheel, laid out like a ROCm torch wheel past 4 GiB: a stored data member of
    ``size`` bytes first, which puts every later offset past 4 GiB, then BIG_COPIES copies of
    ``source``'s packages (``rocbench/`` as ``rocbench0/``, ...): its HIP libraries with their
    RPATHs, code objects and Python files, thousands of members and hundreds of ELF files. Its name
    and version are ``out``'s."""
    import base64
    import hashlib

    def b64(digest: bytes) -> str:
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    name, version = out.name.split("-")[:2]
    dist_info = f"{name}-{version}.dist-info"
    small = {
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: rocwheels-benchmark\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    block = os.urandom(64 << 20)  # incompressible: stored, the file itself passes 4 GiB
    rows = []
    with zipfile.ZipFile(source) as archive, zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        info = zipfile.ZipInfo(f"{name}/data.bin", ZIP_DATE)
        info.compress_type = zipfile.ZIP_STORED
        digest, left = hashlib.sha256(), int(size)
        with wheel.open(info, "w", force_zip64=True) as sink:
            while left:
                piece = block[: min(left, len(block))]
                sink.write(piece)
                digest.update(piece)
                left -= len(piece)
        rows.append(f"{name}/data.bin,sha256={b64(digest.digest())},{size}")
        packaged = [i for i in archive.infolist() if not i.is_dir() and ".dist-info/" not in i.filename]
        for copy_number in range(BIG_COPIES):
            for member in packaged:
                top, rest = member.filename.split("/", 1)
                entry = zipfile.ZipInfo(f"{top}{copy_number}/{rest}", ZIP_DATE)
                entry.external_attr = member.external_attr
                entry.compress_type = zipfile.ZIP_DEFLATED
                digest = hashlib.sha256()
                with archive.open(member) as data, wheel.open(entry, "w") as sink:
                    while piece := data.read(CHUNK):
                        digest.update(piece)
                        sink.write(piece)
                rows.append(f"{entry.filename},sha256={b64(digest.digest())},{member.file_size}")
        for member_name, text in small.items():
            wheel.writestr(zipfile.ZipInfo(member_name, ZIP_DATE), text, zipfile.ZIP_DEFLATED)
            rows.append(f"{member_name},sha256={b64(hashlib.sha256(text).digest())},{len(text)}")
        wheel.writestr(
            zipfile.ZipInfo(f"{dist_info}/RECORD", ZIP_DATE), "\n".join([*rows, f"{dist_info}/RECORD,,"]) + "\n"
        )
    partial.rename(out)


def main(argv: list[str]) -> int:
    task, *rest = argv
    if task == "bigwheel":
        bigwheel(Path(rest[0]), Path(rest[1]), rest[2])
        return 0
    if task == "read":
        read(Path(rest[0]))
        return 0
    if task == "floor":
        floor(Path(rest[0]), Path(rest[1]), Path(rest[2]), int(rest[3]), int(rest[4]))
        return 0
    if task == "pip-install":
        pip_install(Path(rest[0]), Path(rest[1]), rest[2])
        return 0
    paths = list(map(Path, rest))
    by_paths: dict[str, Callable[..., None]] = {"copy": copy, "rewrite": rewrite, "repair": repair, "analyze": analyze}
    by_paths[task](*paths)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
