"""The measured work that is Python code rather than a command: run in a child process by measure.py.

python tasks.py copy WHEEL OUT_DIR
python tasks.py rewrite WHEEL OUT_DIR        read every member, write a new zip at deflate 6
python tasks.py repair WHEEL OUT_DIR LOG     pipeline.repair.repair.repair_wheel with its defaults
python tasks.py analyze WHEEL                pipeline.wheel.analyze.analyze_wheel
python tasks.py bigwheel WHEEL OUT BYTES     a wheel of WHEEL's smallest library and BYTES of data (ZIP64)
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

REWRITE_LEVEL = 6
ZIP_DATE = (2024, 1, 1, 0, 0, 0)
CHUNK = 1 << 20


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


def analyze(wheel: Path) -> None:
    from pipeline.wheel.analyze import TargetLayout, analyze_wheel

    analysis = analyze_wheel(wheel, TargetLayout())
    targets = sorted({t for member in analysis.members for t in member.gpu_targets})
    bundles = sum(member.bundles for member in analysis.members)
    print(f"analyzed {len(analysis.members)} ELF members, {bundles} offload bundles, GPU targets {', '.join(targets)}")


def bigwheel(source: Path, out: Path, size: str) -> None:
    """``rocbigwheel``: the smallest HIP library of ``source`` (so repair has an RPATH to set) and a
    stored data member of ``size`` bytes, which puts every later offset past 4 GiB."""
    import base64
    import hashlib
    import os

    def b64(digest: bytes) -> str:
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    import tempfile

    from pipeline.wheel.elf import read_elf

    def standalone(data: bytes) -> bool:  # needs no other library of its wheel
        with tempfile.NamedTemporaryFile(suffix=".so") as file:
            file.write(data)
            file.flush()
            return not any(needed.startswith("librocbench") for needed in read_elf(file.name, with_fatbin=False).needed)

    with zipfile.ZipFile(source) as archive:
        libraries = sorted((i for i in archive.infolist() if i.filename.endswith(".so")), key=lambda i: i.file_size)
        library_bytes = next(data for data in map(archive.read, libraries) if standalone(data))
    dist_info = "rocbigwheel-1.0.dist-info"
    small = {
        "rocbigwheel/__init__.py": b"",
        "rocbigwheel/_lib.so": library_bytes,
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: rocwheels-benchmark\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
        f"{dist_info}/METADATA": b"Metadata-Version: 2.1\nName: rocbigwheel\nVersion: 1.0\n",
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    block = os.urandom(64 << 20)  # incompressible: stored, the file itself passes 4 GiB
    rows = []
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as wheel:
        info = zipfile.ZipInfo("rocbigwheel/data.bin", ZIP_DATE)
        info.compress_type = zipfile.ZIP_STORED
        digest, left = hashlib.sha256(), int(size)
        with wheel.open(info, "w", force_zip64=True) as sink:
            while left:
                piece = block[: min(left, len(block))]
                sink.write(piece)
                digest.update(piece)
                left -= len(piece)
        rows.append(f"rocbigwheel/data.bin,sha256={b64(digest.digest())},{size}")
        for name, data in small.items():
            wheel.writestr(zipfile.ZipInfo(name, ZIP_DATE), data, zipfile.ZIP_DEFLATED)
            rows.append(f"{name},sha256={b64(hashlib.sha256(data).digest())},{len(data)}")
        wheel.writestr(
            zipfile.ZipInfo(f"{dist_info}/RECORD", ZIP_DATE), "\n".join([*rows, f"{dist_info}/RECORD,,"]) + "\n"
        )
    partial.rename(out)


def main(argv: list[str]) -> int:
    task, *rest = argv
    if task == "bigwheel":
        bigwheel(Path(rest[0]), Path(rest[1]), rest[2])
        return 0
    paths = list(map(Path, rest))
    {"copy": copy, "rewrite": rewrite, "repair": repair, "analyze": analyze}[task](*paths)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
