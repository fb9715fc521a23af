"""The measured work that is Python code rather than a command: run in a child process by measure.py.

    python tasks.py copy WHEEL OUT_DIR
    python tasks.py rewrite WHEEL OUT_DIR        read every member, write a new zip at deflate 6
    python tasks.py repair WHEEL OUT_DIR LOG     pipeline.repair.repair_wheel with its defaults
    python tasks.py analyze WHEEL                pipeline.analyze.analyze_wheel
"""

from __future__ import annotations

import shutil
import sys
import zipfile
from pathlib import Path

REWRITE_LEVEL = 6
CHUNK = 1 << 20


def copy(wheel: Path, out: Path) -> None:
    shutil.copyfile(wheel, out / wheel.name)


def rewrite(wheel: Path, out: Path) -> None:
    """The floor for any tool that re-compresses a wheel: streamed, so memory stays small."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(out / wheel.name, "w", zipfile.ZIP_DEFLATED, compresslevel=REWRITE_LEVEL) as dest:
        for member in source.infolist():
            info = zipfile.ZipInfo(member.filename, member.date_time)
            info.external_attr = member.external_attr
            info.compress_type = zipfile.ZIP_DEFLATED
            info.file_size = member.file_size  # announces ZIP64 for members over 2 GiB
            with source.open(member) as data, dest.open(info, "w") as sink:
                shutil.copyfileobj(data, sink, CHUNK)


def repair(wheel: Path, out: Path, log: Path) -> None:
    from pipeline.log import setup_logging
    from pipeline.repair import repair_wheel

    setup_logging()  # the "repaired ... (auditwheel x s, RPATHs ..., write ...)" line, parsed by run.py
    repair_wheel(wheel, out, log_file=log)  # default RepairSettings: the ROCm excludes only


def analyze(wheel: Path) -> None:
    from pipeline.analyze import TargetLayout, analyze_wheel

    analysis = analyze_wheel(wheel, TargetLayout())
    targets = sorted({t for member in analysis.members for t in member.gpu_targets})
    bundles = sum(member.bundles for member in analysis.members)
    print(f"analyzed {len(analysis.members)} ELF members, {bundles} offload bundles, GPU targets {', '.join(targets)}")


def main(argv: list[str]) -> int:
    task, wheel, *rest = argv
    paths = [Path(wheel), *map(Path, rest)]
    {"copy": copy, "rewrite": rewrite, "repair": repair, "analyze": analyze}[task](*paths)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
