"""Speed and memory of rocwheels' repair and analysis against auditwheel, measured in one run.

    python benchmarks/run.py [--size-mb 400] [--repeat 3] [--cache build/bench]

Generates (once, cached) a large ROCm-like wheel, then measures on it, each in a fresh process,
``--repeat`` times in turn (median reported): auditwheel repair with the ROCm excludes (the
reference), rocwheels' repair_wheel, a file copy and a full zip rewrite (context), auditwheel show
(the reference) and rocwheels' analyze_wheel. Prints the table, the ratios against the references
and PASS/FAIL per target of targets.toml; exits 1 if a target fails, 2 if a measurement failed.
See README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomllib

from pipeline.audit import ZIP_LEVEL as AUDITWHEEL_ZIP_LEVEL

# testwheel sits beside this file, and python puts this file's folder on sys.path.
from testwheel import describe, ensure_test_wheel

from pipeline.errors import RocwheelsError
from pipeline.rocm_policy import load_policy

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable
MB = 1 << 20
# repair_wheel's closing log line: where its time went.
_PHASES = re.compile(r"in (?P<total>[\d.]+) s \(auditwheel (?P<auditwheel>[\d.]+) s, RPATHs of (?P<files>\d+) files (?P<rpath>[\d.]+) s, write (?P<write>[\d.]+) s\)")


@dataclass(frozen=True)
class Measurement:
    key: str
    label: str  # in the table
    short: str  # in the ratios
    command: Callable[[Path, Path, Path], list[str]]  # (wheel, output folder, log folder) -> argv


def _auditwheel_repair(wheel: Path, out: Path, logs: Path) -> list[str]:
    """What a careful team runs by hand: every ROCm library excluded, auditwheel's defaults otherwise."""
    excludes = [arg for pattern in load_policy().excludes for arg in ("--exclude", pattern)]
    return [PYTHON, "-m", "auditwheel", "repair", *excludes, "-w", str(out), str(wheel)]


def _task(name: str, *extra: str) -> Callable[[Path, Path, Path], list[str]]:
    def command(wheel: Path, out: Path, logs: Path) -> list[str]:
        values = {"out": str(out), "log": str(logs / "repair-auditwheel.log")}
        return [PYTHON, str(HERE / "tasks.py"), name, str(wheel), *(values[e] for e in extra)]
    return command


MEASUREMENTS = (
    Measurement("auditwheel-repair", "auditwheel repair --exclude <ROCm> (reference)", "auditwheel repair", _auditwheel_repair),
    Measurement("rocwheels-repair", "rocwheels repair_wheel", "rocwheels repair", _task("repair", "out", "log")),
    Measurement("copy", "file copy (context)", "file copy", _task("copy", "out")),
    Measurement("rewrite", "zip rewrite, deflate 6 (context)", "zip rewrite", _task("rewrite", "out")),
    Measurement("auditwheel-show", "auditwheel show (reference)", "auditwheel show",
                lambda wheel, out, logs: [PYTHON, "-m", "auditwheel", "show", str(wheel)]),
    Measurement("rocwheels-analyze", "rocwheels analyze_wheel", "rocwheels analyze", _task("analyze")),
)
# Ratios printed, (measured, reference): the targeted pairs first, then context.
RATIOS = (
    ("rocwheels-repair", "auditwheel-repair"),
    ("rocwheels-analyze", "auditwheel-show"),
    ("auditwheel-repair", "rewrite"),
    ("rocwheels-repair", "rewrite"),
    ("auditwheel-repair", "copy"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=int, default=400, help="unpacked size of the test wheel (default 400)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the median is reported (default 3)")
    parser.add_argument("--cache", type=Path, default=ROOT / "build" / "bench", help="where the test wheel and run files go")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.size_mb < 10:
        parser.error("--repeat must be >= 1 and --size-mb >= 10")
    started = time.monotonic()
    try:
        targets = tomllib.loads((HERE / "targets.toml").read_text())["target"]
        print(f"test wheel of {args.size_mb} MB unpacked, in {args.cache} (generated once, ~25 s at 400 MB)", flush=True)
        wheel = ensure_test_wheel(args.cache.resolve(), args.size_mb)
        origin = "reused" if wheel.reused else f"generated in {wheel.manifest['generated_in_s']} s"
        print(f"  {describe(wheel.manifest)} ({origin})", flush=True)
        results = _measure_all(wheel.path, args.cache.resolve() / "run", args.repeat)
    except RocwheelsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summary = _summarize(results)
    _print_table(summary)
    _print_phases(results["rocwheels-repair"])
    _print_ratios(summary)
    failed = _check_targets(summary, targets)
    report = {"wheel": wheel.manifest, "repeat": args.repeat, "cpus": os.cpu_count(), "runs": results, "median": summary}
    (args.cache / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nbenchmark took {time.monotonic() - started:.0f} s; raw numbers in {args.cache / 'results.json'}")
    return 1 if failed else 0


def _measure_all(wheel: Path, run_dir: Path, repeat: int) -> dict[str, list[dict]]:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    _warm_page_cache(wheel)
    env = {**os.environ, "PATH": os.pathsep.join(filter(None, (sysconfig.get_path("scripts"), os.environ.get("PATH"))))}
    results: dict[str, list[dict]] = {m.key: [] for m in MEASUREMENTS}
    # Round robin, so drift (page cache, thermal, a neighbour) spreads over all measurements alike.
    for round_ in range(1, repeat + 1):
        for measurement in MEASUREMENTS:
            out, logs = run_dir / "out", run_dir / f"logs-{round_}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            logs.mkdir(exist_ok=True)
            result_file, log = logs / f"{measurement.key}.json", logs / f"{measurement.key}.log"
            command = measurement.command(wheel, out, logs)
            os.sync()  # the previous run's dirty pages are written back now, not during this one
            subprocess.run([PYTHON, str(HERE / "measure.py"), str(result_file), str(log), "--", *command], env=env, check=True)
            result = json.loads(result_file.read_text())
            if result["returncode"] != 0:
                raise RocwheelsError(
                    f"{measurement.label} failed with exit code {result['returncode']}: {' '.join(command)}",
                    fix=f"see its output in {log}",
                )
            outputs = sorted(out.glob("*.whl"))
            result["output_mb"] = sum(p.stat().st_size for p in outputs) / MB if outputs else None
            result["log"] = str(log)
            phases = _PHASES.search(log.read_text(errors="replace"))
            if phases:
                result["phases"] = {k: float(v) for k, v in phases.groupdict().items()}
            results[measurement.key].append(result)
            print(f"  round {round_}/{repeat}  {measurement.label:<48} {result['seconds']:7.2f} s  {result['maxrss_mb']:7.1f} MB", flush=True)
    shutil.rmtree(run_dir / "out", ignore_errors=True)
    return results


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
            "tree_peak_mb": statistics.median(r["tree_peak_mb"] for r in runs),
            "cpu_s": statistics.median(r["user_s"] + r["sys_s"] for r in runs),
            "output_mb": runs[-1]["output_mb"],
        }
    return summary


def _print_table(summary: dict[str, dict]) -> None:
    print(f"\n{'measurement':<48} {'median s':>9} {'min-max s':>13} {'CPU s':>7} {'peak RSS MB':>12} {'tree MB':>8} {'output MB':>10}")
    for m in MEASUREMENTS:
        s = summary[m.key]
        output = f"{s['output_mb']:.1f}" if s["output_mb"] is not None else "-"
        print(f"{m.label:<48} {s['seconds']:9.2f} {s['min_s']:6.2f}-{s['max_s']:<6.2f} {s['cpu_s']:7.1f} "
              f"{s['maxrss_mb']:12.1f} {s['tree_peak_mb']:8.1f} {output:>10}")
    print("peak RSS: largest single process (getrusage); tree: largest sampled sum over the process tree")


def _print_phases(runs: list[dict]) -> None:
    phased = [r["phases"] for r in runs if "phases" in r]
    if not phased:
        return
    median = {k: statistics.median(p[k] for p in phased) for k in phased[0]}
    print(f"\nrocwheels repair_wheel, by its own log (median): auditwheel -z {AUDITWHEEL_ZIP_LEVEL} {median['auditwheel']:.2f} s, "
          f"RPATHs of {median['files']:.0f} files {median['rpath']:.2f} s, final write (deflate 6) {median['write']:.2f} s "
          f"= {median['total']:.2f} s")


def _ratio(summary: dict[str, dict], measured: str, reference: str, metric: str) -> float:
    return summary[measured][metric] / summary[reference][metric]


def _print_ratios(summary: dict[str, dict]) -> None:
    short = {m.key: m.short for m in MEASUREMENTS}
    print(f"\n{'ratios (same run, same wheel)':<42} {'time':>8} {'peak RSS':>9}")
    for measured, reference in RATIOS:
        print(f"  {short[measured] + ' / ' + short[reference]:<40} {_ratio(summary, measured, reference, 'seconds'):7.2f}x "
              f"{_ratio(summary, measured, reference, 'maxrss_mb'):8.2f}x")


def _check_targets(summary: dict[str, dict], targets: list[dict]) -> list[str]:
    print("\ntargets (benchmarks/targets.toml)")
    failed = []
    for target in targets:
        ratio = _ratio(summary, target["measured"], target["reference"], target["metric"])
        ok = ratio <= target["max_ratio"]
        metric = "time" if target["metric"] == "seconds" else "peak RSS"
        print(f"  {'PASS' if ok else 'FAIL'}  {target['name']:<14} {target['measured']} / {target['reference']} {metric}: "
              f"{ratio:.2f}x (target <= {target['max_ratio']:.2f}x)")
        if not ok:
            failed.append(target["name"])
    return failed


if __name__ == "__main__":
    sys.exit(main())
