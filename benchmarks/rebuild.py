"""Rebuilds of the canary through `rocwheels wheels`, measured in one run:

    python benchmarks/rebuild.py [--arch gfx90a] [--cache build/bench] [--json RESULT.json]

1. cold: an empty work folder, wheelhouse and compiler cache;
2. warm: after what `make clean` removes (work folder and wheelhouse), with the compiler cache
   kept: prints the cache's hit rate and the cold/warm time ratio;
3. no-op: the same command once more, nothing changed: must build nothing, in under 2 s.

The compiler cache is sccache with a Redis backend (a real redis-server on loopback, as a team's
shared cache would be); the local driver on this host's ROCm line. Exits 1 if the no-op run builds
or is slow, 2 if a run fails. run.py runs it as a part of `make bench` and puts its figures, from
``--json``, in its table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from canary import canary_wheels

ROOT = Path(__file__).resolve().parent.parent
# The tests' redis-server helper (on a free loopback port, nothing kept on disk).
sys.path.insert(0, str(ROOT))
from tests.helpers.redis_server import running_redis  # noqa: E402

ROCWHEELS = Path(sys.executable).parent / "rocwheels"
NO_OP_SECONDS = 2.0
_HITS = re.compile(r"sccache: \d+% hits \(\d+ of \d+ compilations\)")


def timed_wheels(arch: str, work: Path, env: dict[str, str]) -> tuple[float, str]:
    """Seconds and output of `rocwheels wheels` for the canary with the local driver."""
    argv = [str(ROCWHEELS), *canary_wheels(arch, work / "wheelhouse", work / "build")]
    started = time.monotonic()
    result = subprocess.run(
        argv, env={**os.environ, **env}, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    seconds = time.monotonic() - started
    if result.returncode != 0:
        print(result.stdout[-3000:])
        print(f"`{' '.join(argv)}` failed with exit code {result.returncode}", file=sys.stderr)
        sys.exit(2)
    return seconds, result.stdout


def clean(work: Path) -> None:
    """What `make clean` removes: the work folder and the wheelhouse."""
    for folder in (work / "build", work / "wheelhouse"):
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="gfx90a", help="a target this host's hipcc compiles (default gfx90a)")
    parser.add_argument("--cache", type=Path, default=ROOT / "build" / "bench")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()
    work = args.cache / "rebuild"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    with running_redis("127.0.0.1", work) as url:
        env = {"ROCWHEELS_SCCACHE": url, "HIP_PLATFORM": "amd"}
        cold, cold_out = timed_wheels(args.arch, work, env)
        clean(work)
        warm, warm_out = timed_wheels(args.arch, work, env)
        no_op, no_op_out = timed_wheels(args.arch, work, env)
    cold_hits = _HITS.search(cold_out)
    warm_hits = _HITS.search(warm_out)
    print(f"compiler cache ({url}, sccache):")
    print(f"  cold build  {cold:7.1f} s   {cold_hits.group(0) if cold_hits else 'no sccache line'}")
    print(
        f"  warm build  {warm:7.1f} s   {warm_hits.group(0) if warm_hits else 'no sccache line'}   (after make clean)"
    )
    print(f"  cold/warm   {cold / warm:7.2f}x")
    built_again = "up to date" not in no_op_out  # the summary's status of the canary
    verdict = "PASS" if no_op < NO_OP_SECONDS and not built_again else "FAIL"
    print(
        f"no-op make wheels {no_op:5.2f} s (target < {NO_OP_SECONDS:.0f} s, no build): {verdict}"
        f"{' (it built)' if built_again else ''}"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cold_s": cold,
                    "warm_s": warm,
                    "no_op_s": no_op,
                    "no_op_limit_s": NO_OP_SECONDS,
                    "built_again": built_again,
                    "warm_hits": warm_hits.group(0) if warm_hits else None,
                }
            )
        )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
