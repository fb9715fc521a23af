"""Speed and memory of rocwheels' repair and analysis against auditwheel, measured in one run.

    python benchmarks/run.py [--size-mb 400] [--repeat 3] [--cache build/bench] [--skip-zip64]

On the generated benchmark wheel and on real ROCm wheels from PyPI (downloaded once into the
cache), each measurement in a fresh process, ``--repeat`` times in turn (median reported; the
sub-second ones five times per round):
``auditwheel repair`` with the ROCm excludes (the reference), rocwheels' repair on all cores and
on one, a file copy, and the same for the wheel repaired once (which needs no change); auditwheel
show against rocwheels' analysis. Checks rocwheels' result against auditwheel's own, then repairs
and verifies a wheel above 4 GiB (ZIP64). Prints PASS/FAIL per target of targets.toml; exits 1 if
a target or a check fails, 2 if a measurement failed. See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

# testwheel sits beside this file, and python puts this file's folder on sys.path.
from testwheel import describe, ensure_test_wheel

from pipeline.errors import RocwheelsError
from pipeline.repair.policy import load_policy
from pipeline.util.cmd import run
from pipeline.wheel.archive import check_wheel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable
MB = 1 << 20
# Real ROCm 7 wheels on PyPI of 70 MB or more (sizes seen by `pip download`, 2026-12: 73.5 MB and
# 133.4 MB; jax's holds one 459 MB library). Pinned, so every run measures the same bytes.
PYPI_WHEELS = ("cupy-rocm-7-0==14.2.0", "jax-rocm7-pjrt==0.12.0")
QUICK_SAMPLES = 5  # runs per round of the sub-second measurements (Measurement.samples)
ZIP64_BYTES = (4 << 30) + (256 << 20)  # the data member of the ZIP64 wheel: past 4 GiB


@dataclass(frozen=True)
class Measurement:
    key: str
    label: str
    command: Callable[[Path, Path, Path], list[str]]  # (wheel, output folder, log file) -> argv
    fixed: bool = False  # on the wheel repaired once (needs no change) instead of the raw one
    fresh_cache: bool = False  # with an empty rocwheels cache: no note of an earlier repair
    env: dict[str, str] = field(default_factory=dict)
    # Runs per round. Sub-second measurements take several: a few hundredths of a second of this
    # machine's noise (a neighbour's writeback, the previous run's freed files) are a third of them.
    samples: int = 1


def _auditwheel_repair(wheel: Path, out: Path, log: Path) -> list[str]:
    """What a careful team runs by hand: every ROCm library excluded, auditwheel's defaults otherwise."""
    excludes = [arg for pattern in load_policy().excludes for arg in ("--exclude", pattern)]
    return [PYTHON, "-m", "auditwheel", "repair", *excludes, "-w", str(out), str(wheel)]


def _task(name: str, *, one_core: bool = False, with_out: bool = True) -> Callable[[Path, Path, Path], list[str]]:
    def command(wheel: Path, out: Path, log: Path) -> list[str]:
        pinned = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if one_core else []
        extra = [str(out), str(log)] if name == "repair" else [str(out)] if with_out else []
        return [*pinned, PYTHON, str(HERE / "tasks.py"), name, str(wheel), *extra]

    return command


MEASUREMENTS = (
    Measurement("auditwheel-repair", "auditwheel repair --exclude <ROCm> (reference)", _auditwheel_repair),
    Measurement("repair", "rocwheels repair, all cores", _task("repair")),
    Measurement("repair-1core", "rocwheels repair, 1 core", _task("repair", one_core=True)),
    Measurement("copy", "file copy", _task("copy"), samples=QUICK_SAMPLES),
    Measurement("auditwheel-repair-fixed", "  no change: auditwheel repair", _auditwheel_repair, fixed=True),
    Measurement("repair-fixed", "  no change: rocwheels repair", _task("repair"), fixed=True, samples=QUICK_SAMPLES),
    Measurement(
        "repair-fixed-judged",
        "  no change: rocwheels repair, empty cache",
        _task("repair"),
        fixed=True,
        fresh_cache=True,
    ),
    Measurement("copy-fixed", "  no change: file copy", _task("copy"), fixed=True, samples=QUICK_SAMPLES),
    Measurement(
        "auditwheel-show",
        "auditwheel show (reference)",
        lambda wheel, out, log: [PYTHON, "-m", "auditwheel", "show", str(wheel)],
    ),
    Measurement("analyze", "rocwheels analyze_wheel", _task("analyze", with_out=False)),
    Measurement(
        "inspect",
        "rocwheels inspect (the command)",
        lambda wheel, out, log: [PYTHON, "-m", "pipeline", "inspect", str(wheel)],
    ),
)
# Printed for every wheel, (measured, reference); the targets of targets.toml are among them.
RATIOS = (
    ("repair", "auditwheel-repair"),
    ("repair", "repair-1core"),
    ("repair-fixed", "copy-fixed"),
    ("repair-fixed", "auditwheel-repair-fixed"),
    ("repair-fixed-judged", "copy-fixed"),
    ("repair-fixed-judged", "auditwheel-repair-fixed"),
    ("analyze", "auditwheel-show"),
    ("inspect", "auditwheel-show"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=400, help="unpacked size of the generated wheel (default 400)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each measurement; the median is reported (default 3)"
    )
    parser.add_argument(
        "--cache", type=Path, default=ROOT / "build" / "bench", help="where the wheels and run files go"
    )
    parser.add_argument("--skip-zip64", action="store_true", help="skip the wheel above 4 GiB (writes ~4.3 GB twice)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.size_mb < 10:
        parser.error("--repeat must be >= 1 and --size-mb >= 10")
    cache = args.cache.resolve()
    started = time.monotonic()
    print(
        f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at start",
        flush=True,
    )
    try:
        # Byte-compiled, as pip leaves an installed package: with PYTHONDONTWRITEBYTECODE set every
        # measured process would compile rocwheels' sources again, which no user pays.
        run([PYTHON, "-m", "compileall", "-q", str(ROOT / "pipeline"), str(HERE)], quiet=True)
        targets = tomllib.loads((HERE / "targets.toml").read_text())["target"]
        generated = ensure_test_wheel(cache, args.size_mb)
        print(f"  {describe(generated.manifest)} ({'reused' if generated.reused else 'generated'})", flush=True)
        wheels = [*_pypi_wheels(cache / "pypi"), generated.path]
        report: dict = {"cpus": os.cpu_count(), "repeat": args.repeat, "wheels": {}}
        failed: list[str] = []
        for wheel in wheels:
            print(f"\n== {wheel.name} ({wheel.stat().st_size / MB:.1f} MB)", flush=True)
            results, problems = _measure_wheel(wheel, cache / "run", args.repeat)
            summary = _summarize(results)
            _print_table(summary)
            _print_ratios(summary)
            failed += [f"{wheel.name}: {name}" for name in _check_targets(summary, targets)]
            failed += [f"{wheel.name}: {problem}" for problem in problems]
            report["wheels"][wheel.name] = {"runs": results, "median": summary, "problems": problems}
        if not args.skip_zip64:
            report["zip64"] = _zip64(generated.path, cache)
            failed += [f"zip64: {problem}" for problem in report["zip64"]["problems"]]
    except (RocwheelsError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["load_average_end"] = os.getloadavg()
    (cache / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\nload average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}; benchmark took "
        f"{time.monotonic() - started:.0f} s; raw numbers in {cache / 'results.json'}"
    )
    for failure in failed:
        print(f"FAIL {failure}")
    return 1 if failed else 0


def _pypi_wheels(folder: Path) -> list[Path]:
    """The pinned real wheels, downloaded once with pip into ``folder``."""
    found = []
    for requirement in PYPI_WHEELS:
        name, version = requirement.split("==")
        pattern = f"{name.replace('-', '_')}-{version}-*.whl"
        if not list(folder.glob(pattern)):
            print(f"downloading {requirement} from PyPI (once)", flush=True)
            run(
                [
                    PYTHON,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--python-version",
                    "3.11",
                    "--disable-pip-version-check",
                    "-d",
                    folder,
                    requirement,
                ]
            )
        (wheel,) = folder.glob(pattern)
        if wheel.stat().st_size < 70 * MB:
            raise RocwheelsError(
                f"{wheel.name} is {wheel.stat().st_size / MB:.1f} MB, not the >= 70 MB the benchmark needs",
                fix="pin another release in PYPI_WHEELS",
            )
        found.append(wheel)
    return found


def _run_once(m: Measurement, wheel: Path, run_dir: Path, round_: int, env: dict[str, str]) -> tuple[dict, Path | None]:
    """One run of ``m`` on ``wheel`` through measure.py: its result, and the wheel it wrote (if any)."""
    out, logs = run_dir / "out" / m.key, run_dir / f"logs-{round_}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    logs.mkdir(exist_ok=True)
    result_file, log = logs / f"{m.key}.json", logs / f"{m.key}.log"
    run_env = {**env, **m.env}
    if m.fresh_cache:
        run_env["ROCWHEELS_CACHE"] = str(run_dir / f"empty-cache-{round_}-{m.key}")
    command = m.command(wheel, out, logs / f"{m.key}.repair.log")
    os.sync()  # the previous run's dirty pages are written back now, not during this one
    subprocess.run(
        [PYTHON, str(HERE / "measure.py"), str(result_file), str(log), "--", *command], env=run_env, check=True
    )
    result = json.loads(result_file.read_text())
    if result["returncode"] != 0:
        raise RocwheelsError(
            f"{m.label} failed with exit code {result['returncode']}: {' '.join(command)}",
            fix=f"see its output in {log}",
        )
    outputs = sorted(out.glob("*.whl"))
    result["output_mb"] = sum(p.stat().st_size for p in outputs) / MB if outputs else None
    result["load_average"] = os.getloadavg()[0]
    return result, outputs[0] if outputs else None


def _measure_wheel(wheel: Path, run_dir: Path, repeat: int) -> tuple[dict[str, list[dict]], list[str]]:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env = {**os.environ, "PATH": os.pathsep.join(filter(None, (sysconfig.get_path("scripts"), os.environ.get("PATH"))))}
    notes = run_dir / "rocwheels-cache"
    env["ROCWHEELS_CACHE"] = str(notes)
    # The wheel repaired once, not measured: the no-change input, and the note rocwheels keeps of it.
    fixed_dir = run_dir / "fixed"
    fixed_dir.mkdir()
    subprocess.run(
        [PYTHON, str(HERE / "tasks.py"), "repair", str(wheel), str(fixed_dir), str(run_dir / "fixed.log")],
        env=env,
        check=True,
    )
    (fixed,) = fixed_dir.glob("*.whl")
    for path in (wheel, fixed):
        _warm_page_cache(path)
    results: dict[str, list[dict]] = {m.key: [] for m in MEASUREMENTS}
    kept: dict[str, Path] = {}
    # Round robin, so drift (page cache, a neighbour's load) spreads over all measurements alike.
    for round_ in range(1, repeat + 1):
        for m in MEASUREMENTS:
            for _ in range(m.samples):
                result, output = _run_once(m, fixed if m.fixed else wheel, run_dir, round_, env)
                results[m.key].append(result)
                if output:
                    kept[m.key] = output
                print(
                    f"  round {round_}/{repeat}  {m.label:<48} {result['seconds']:7.2f} s  {result['maxrss_mb']:7.1f} MB"
                    f"  (load {result['load_average']:.1f})",
                    flush=True,
                )
    problems = _compare_with_auditwheel(wheel, kept["repair"], kept["auditwheel-repair"])
    problems += [
        f"the no-change wheel was not copied as it is ({key})"
        for key in ("repair-fixed", "repair-fixed-judged")
        if _sha256(kept[key]) != _sha256(fixed)
    ]
    shutil.rmtree(run_dir / "out", ignore_errors=True)
    return results, problems


def _compare_with_auditwheel(raw: Path, ours: Path, theirs: Path) -> list[str]:
    """rocwheels' repair against auditwheel's on the same wheel: the same members, grafted
    libraries and tag, and the same bytes for every member rocwheels did not patch."""
    problems = []
    our_tag = check_wheel(ours).platform_tags
    their_tags = check_wheel(theirs).platform_tags
    if len(our_tag) != 1 or our_tag[0] not in their_tags:
        problems.append(f"tag {'.'.join(our_tag)} is not one of auditwheel's {'.'.join(their_tags)}")
    with zipfile.ZipFile(raw) as r, zipfile.ZipFile(ours) as o, zipfile.ZipFile(theirs) as t:
        raw_crc = {i.filename: (i.CRC, i.file_size) for i in r.infolist()}
        our_names = {i.filename for i in o.infolist() if not i.is_dir()}
        their_names = {i.filename for i in t.infolist() if not i.is_dir()}
        if our_names != their_names:
            problems.append(
                f"members differ: only ours {sorted(our_names - their_names)[:5]}, only auditwheel's {sorted(their_names - our_names)[:5]}"
            )
        grafted = sorted(n for n in our_names if ".libs/" in n)
        if grafted != sorted(n for n in their_names if ".libs/" in n):
            problems.append("grafted libraries differ")
        patched = [n for n in our_names & set(raw_crc) if (o.getinfo(n).CRC, o.getinfo(n).file_size) != raw_crc[n]]
        unpatched = sorted(
            (our_names & their_names) - set(patched) - {n for n in our_names if n.endswith(".dist-info/RECORD")}
        )
        differing = [n for n in unpatched if _member_sha256(o, n) != _member_sha256(t, n)]
        if differing:
            problems.append(f"unpatched members differ from auditwheel's: {differing[:5]}")
    print(
        f"  check against auditwheel's output: {len(unpatched)} unpatched members byte-identical, "
        f"{len(patched)} patched ({', '.join(sorted(patched))[:200]}), {len(grafted)} grafted, tag {our_tag[0]}: "
        f"{'OK' if not problems else '; '.join(problems)}",
        flush=True,
    )
    return problems


def _member_sha256(archive: zipfile.ZipFile, name: str) -> str:
    digest = hashlib.sha256()
    with archive.open(name) as data:
        while chunk := data.read(4 * MB):
            digest.update(chunk)
    return digest.hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        while chunk := data.read(4 * MB):
            digest.update(chunk)
    return digest.hexdigest()


def _zip64(generated: Path, cache: Path) -> dict:
    """A wheel above 4 GiB (made once, cached): repaired by rocwheels, then verified by two readers."""
    folder = cache / "zip64"
    wheel = folder / "rocbigwheel-1.0-cp311-cp311-linux_x86_64.whl"
    if not wheel.exists():
        print(f"\nmaking a {ZIP64_BYTES / (1 << 30):.2f} GiB wheel (once)", flush=True)
        subprocess.run(
            [PYTHON, str(HERE / "tasks.py"), "bigwheel", str(generated), str(wheel), str(ZIP64_BYTES)], check=True
        )
    out = folder / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    result_file = folder / "repair.json"
    env = {**os.environ, "ROCWHEELS_CACHE": str(folder / "rocwheels-cache")}
    subprocess.run(
        [
            PYTHON,
            str(HERE / "measure.py"),
            str(result_file),
            str(folder / "repair.out"),
            "--",
            PYTHON,
            str(HERE / "tasks.py"),
            "repair",
            str(wheel),
            str(out),
            str(folder / "repair.log"),
        ],
        env=env,
        check=True,
    )
    result = json.loads(result_file.read_text())
    problems = [] if result["returncode"] == 0 else [f"repair failed, see {folder / 'repair.out'}"]
    (repaired,) = out.glob("*.whl") or [None]
    if repaired:
        check_wheel(repaired, verify_hashes=True)
        unzip = subprocess.run(["unzip", "-tq", str(repaired)], capture_output=True, text=True)
        if unzip.returncode != 0:
            problems.append(f"unzip -t: {unzip.stdout.strip()} {unzip.stderr.strip()}")
        print(
            f"\nZIP64: {wheel.stat().st_size / (1 << 30):.2f} GiB wheel repaired in {result['seconds']:.1f} s, "
            f"peak RSS {result['maxrss_mb']:.0f} MB -> {repaired.stat().st_size / (1 << 30):.2f} GiB; RECORD hashes "
            f"checked, unzip -t: {unzip.stdout.strip().splitlines()[-1] if unzip.stdout.strip() else unzip.returncode}",
            flush=True,
        )
        shutil.rmtree(out)
    return {"result": result, "problems": problems}


def _warm_page_cache(wheel: Path) -> None:
    """Every measurement reads the wheel from the page cache, the first one too."""
    with wheel.open("rb") as stream:
        while stream.read(16 * MB):
            pass


def _summarize(results: dict[str, list[dict]]) -> dict[str, dict]:
    summary = {}
    for key, runs in results.items():
        seconds = [r["seconds"] for r in runs]
        summary[key] = {
            "seconds": statistics.median(seconds),
            "min_s": min(seconds),
            "max_s": max(seconds),
            "maxrss_mb": statistics.median(r["maxrss_mb"] for r in runs),
            "cpu_s": statistics.median(r["user_s"] + r["sys_s"] for r in runs),
            "output_mb": runs[-1]["output_mb"],
            "load_average": statistics.median(r["load_average"] for r in runs),
        }
    return summary


def _print_table(summary: dict[str, dict]) -> None:
    print(
        f"\n  {'measurement':<48} {'median s':>9} {'min-max s':>13} {'CPU s':>7} {'peak RSS MB':>12} {'output MB':>10} {'load':>5}"
    )
    for m in MEASUREMENTS:
        s = summary[m.key]
        output = f"{s['output_mb']:.1f}" if s["output_mb"] is not None else "-"
        print(
            f"  {m.label:<48} {s['seconds']:9.2f} {s['min_s']:6.2f}-{s['max_s']:<6.2f} {s['cpu_s']:7.1f} "
            f"{s['maxrss_mb']:12.1f} {output:>10} {s['load_average']:5.1f}"
        )


def _ratio(summary: dict[str, dict], measured: str, reference: str, metric: str) -> float:
    return summary[measured][metric] / summary[reference][metric]


def _print_ratios(summary: dict[str, dict]) -> None:
    print(f"\n  {'ratios (same run, same wheel)':<52} {'time':>8} {'peak RSS':>9}")
    for measured, reference in RATIOS:
        print(
            f"  {measured + ' / ' + reference:<52} {_ratio(summary, measured, reference, 'seconds'):7.3f}x "
            f"{_ratio(summary, measured, reference, 'maxrss_mb'):8.2f}x"
        )


def _check_targets(summary: dict[str, dict], targets: list[dict]) -> list[str]:
    failed = []
    for target in targets:
        ratio = _ratio(summary, target["measured"], target["reference"], target["metric"])
        ok = ratio <= target["max_ratio"]
        metric = "time" if target["metric"] == "seconds" else "peak RSS"
        print(
            f"  {'PASS' if ok else 'FAIL'}  {target['name']:<26} {target['measured']} / {target['reference']} {metric}: "
            f"{ratio:.3f}x (target <= {target['max_ratio']:.3f}x)"
        )
        if not ok:
            failed.append(target["name"])
    return failed


if __name__ == "__main__":
    sys.exit(main())
