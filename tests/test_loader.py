"""verify's library resolution against the real dynamic loader.

Each case is a small wheel built here with gcc (musl-gcc for the musl ones): ELF files with
DT_RPATH or DT_RUNPATH in the layouts real wheels have. The wheel is installed into a fresh venv
and its entry point is imported (or, for a musl program, run); verify's verdict on unresolved
libraries must be what that did. The test process sets LD_LIBRARY_PATH to the build folders,
which hold every library: verify must not look at it.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

import pytest

from pipeline.repair.policy import LinkPackage
from pipeline.util.cmd import run
from pipeline.verify.verify import Expectations, verify_wheel
from pipeline.wheel.analyze import TargetLayout
from tests.helpers import ROCWHEELS
from tests.helpers.elf_builds import Elf, SearchPaths, build
from tests.helpers.hip_wheels import EXT


@dataclass(frozen=True)
class Case:
    files: tuple[Elf, ...]  # the first is the entry point: an extension module, or a musl program
    loads: bool  # what the loader does (the test checks this too)
    provider: tuple[Elf, ...] = ()  # files of a second wheel installed beside it (torch/lib's role)
    link_packages: tuple[str, ...] = ()


def ext(needs: str, **paths: Unpack[SearchPaths]) -> Elf:
    return Elf(f"pkg/_ext{EXT}", (needs,), **paths)


CASES = {
    # The case: liba has no search path of its own and finds libb through _ext's DT_RPATH.
    "rpath-inherited": Case(
        (ext("pkg/liba.so", rpath="$ORIGIN"), Elf("pkg/liba.so", ("pkg/libb.so",)), Elf("pkg/libb.so")), True
    ),
    "runpath-not-inherited": Case(
        (ext("pkg/liba.so", runpath="$ORIGIN"), Elf("pkg/liba.so", ("pkg/libb.so",)), Elf("pkg/libb.so")), False
    ),
    "rpath-two-levels-down": Case(
        (
            ext("pkg/lib/liba.so", rpath="$ORIGIN/lib"),
            Elf("pkg/lib/liba.so", ("pkg/lib/libb.so",)),
            Elf("pkg/lib/libb.so", ("pkg/lib/libc0.so",)),
            Elf("pkg/lib/libc0.so"),
        ),
        True,
    ),
    # liba's own DT_RUNPATH switches the inherited DT_RPATH off for liba's dependencies.
    "runpath-stops-inherited-rpath": Case(
        (
            ext("pkg/lib/liba.so", rpath="$ORIGIN/lib"),
            Elf("pkg/lib/liba.so", ("pkg/lib/libb.so",), runpath="$ORIGIN/../other"),
            Elf("pkg/lib/libb.so"),
        ),
        False,
    ),
    "runpath-direct": Case(
        (
            ext("pkg/lib/liba.so", runpath="$ORIGIN/lib"),
            Elf("pkg/lib/liba.so", ("pkg/lib/libb.so",), runpath="$ORIGIN"),
            Elf("pkg/lib/libb.so"),
        ),
        True,
    ),
    # auditwheel's layout: grafted copies with a hash in the name, next to each other in <pkg>.libs.
    "grafted-libs": Case(
        (
            ext("pkg.libs/libx-0a1b2c3d.so", rpath="$ORIGIN/../pkg.libs"),
            Elf("pkg.libs/libx-0a1b2c3d.so", ("pkg.libs/liby-4e5f6a7b.so",), rpath="$ORIGIN"),
            Elf("pkg.libs/liby-4e5f6a7b.so"),
        ),
        True,
    ),
    "no-search-path": Case((ext("pkg/liba.so"), Elf("pkg/liba.so")), False),
    "linked-package": Case(
        (ext("torchlike/lib/libtorchlike.so", rpath="$ORIGIN/../torchlike/lib"),),
        True,
        (Elf("torchlike/lib/libtorchlike.so"),),
        ("torchlike/lib:libtorchlike*.so",),
    ),
    "linked-package-unreached": Case(
        (ext("torchlike/lib/libtorchlike.so", rpath="$ORIGIN"),),
        False,
        (Elf("torchlike/lib/libtorchlike.so"),),
        ("torchlike/lib:libtorchlike*.so",),
    ),
    # musl's loader inherits DT_RUNPATH too: the glibc case above fails, this one works.
    "musl-runpath-inherited": Case(
        (
            Elf("pkg/bin/tool", ("pkg/lib/liba.so",), runpath="$ORIGIN/../lib", musl=True, program=True),
            Elf("pkg/lib/liba.so", ("pkg/lib/libb.so",), musl=True),
            Elf("pkg/lib/libb.so", musl=True),
        ),
        True,
    ),
    "musl-no-search-path": Case(
        (Elf("pkg/bin/tool", ("pkg/lib/liba.so",), musl=True, program=True), Elf("pkg/lib/liba.so", musl=True)), False
    ),
}


def _site_packages(python: Path) -> Path:
    return Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"]).output.strip())


def _loads(python: Path, entry: Elf) -> tuple[bool, str]:
    """What the loader does with the installed entry point, without this process's LD_LIBRARY_PATH."""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    if entry.program:
        argv = [str(_site_packages(python) / entry.member)]
    else:
        argv = [str(python), "-c", f"import {entry.member.removesuffix(EXT).replace('/', '.')}"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True)
    return result.returncode == 0, result.stderr


# A musl case carries the marker itself: its fixture is asked for only once the case is known.
@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.musl) if any(e.musl for e in c.files) else n for n, c in CASES.items()]
)
def test_verdict_is_what_the_loader_does(name, tmp_path, platform_wheel, fresh_venv, pip_install, monkeypatch, request):
    case = CASES[name]
    if any(e.musl for e in case.files):
        request.getfixturevalue("musl_gcc")
    provided = build(case.provider, tmp_path / "build")
    built = build(case.files, tmp_path / "build")
    wheels = [platform_wheel(tmp_path / "dist", "loadercase", built)]
    if case.provider:
        wheels.append(platform_wheel(tmp_path / "dist", "torchlike", provided))
    # Every library lies on the host's LD_LIBRARY_PATH: a verdict that used it would say "loads".
    monkeypatch.setenv("LD_LIBRARY_PATH", ":".join(sorted({str(p.parent) for p in built.values()})))
    layout = TargetLayout(link_packages=tuple(LinkPackage.parse(entry) for entry in case.link_packages))
    report = verify_wheel(wheels[0], Expectations(layout=layout), smoke=False)
    unresolved = [f.message for f in report.findings if f.check == "unresolved"]

    pip_install(fresh_venv, "--no-index", "--no-deps", *wheels)
    loads, stderr = _loads(fresh_venv, case.files[0])

    assert loads == case.loads, stderr
    assert (not unresolved) == loads, unresolved or stderr


def test_musl_libc_is_a_system_library(tmp_path, platform_wheel, musl_gcc):
    program = Elf("pkg/bin/tool", musl=True, program=True)
    wheel = platform_wheel(
        tmp_path, "muslcase", build((program,), tmp_path / "build"), platform_tag="musllinux_1_2_x86_64"
    )
    report = verify_wheel(wheel, Expectations(), smoke=False)
    assert not [f for f in report.errors() if f.check in ("unresolved", "tags")], report.findings
    result = subprocess.run([*ROCWHEELS, "inspect", wheel], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "not a system library" not in result.stdout
