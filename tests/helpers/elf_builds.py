"""Small ELF files built with gcc (or musl-gcc) for the loader and differential tests: extension
modules, plain libraries and programs, linked to each other with the DT_RPATH or DT_RUNPATH
asked for. Each library defines ``<name>()`` returning 1 plus what its dependencies return, so
every DT_NEEDED entry is really used.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from pipeline.util.cmd import run
from tests.helpers.hip_wheels import EXT, PY_INCLUDE


class SearchPaths(TypedDict, total=False):
    """The search paths an :class:`Elf` may be given by keyword: rpath=, runpath=."""

    rpath: str
    runpath: str


@dataclass(frozen=True)
class Elf:
    member: str  # where it lies (in the wheel, or beside it for a library to be grafted)
    needs: tuple[str, ...] = ()  # members it links
    rpath: str | None = None  # DT_RPATH; "{build}" stands for the build folder (a build-machine path)
    runpath: str | None = None  # DT_RUNPATH, the same way
    musl: bool = False  # built with musl-gcc
    program: bool = False  # an executable instead of a shared library

    @property
    def soname(self) -> str:
        return self.member.rsplit("/", 1)[-1]

    @property
    def function(self) -> str:
        return re.sub(r"\W", "_", self.soname)

    @property
    def module(self) -> str | None:
        """The extension module name, for an extension."""
        return self.soname.split(".")[0] if self.soname.endswith(EXT) else None


def _source(elf: Elf, needed: list[Elf]) -> str:
    calls = " + ".join(f"{n.function}()" for n in needed) or "0"
    declarations = "".join(f"int {n.function}(void);\n" for n in needed)
    if elf.module:
        return (
            f"#include <Python.h>\n{declarations}"
            f'static struct PyModuleDef def = {{PyModuleDef_HEAD_INIT, "{elf.module}", 0, -1, 0}};\n'
            f"PyMODINIT_FUNC PyInit_{elf.module}(void) {{ return {calls} >= 0 ? PyModule_Create(&def) : 0; }}\n"
        )
    if elf.program:
        return f"{declarations}int main(void) {{ return {calls} > 0 ? 0 : 1; }}\n"
    return f"{declarations}int {elf.function}(void) {{ return 1 + {calls}; }}\n"


def build(files: tuple[Elf, ...], out: Path) -> dict[str, Path]:
    """Compile ``files`` under ``out`` (each at ``out/<member>``); returns member -> built file.

    A file's dependencies must come later in ``files`` or have been built into ``out`` before.
    """
    built: dict[str, Path] = {}
    everything = {e.member: e for e in files}
    for elf in reversed(files):
        target = out / elf.member
        target.parent.mkdir(parents=True, exist_ok=True)
        needed = [everything.get(m) or Elf(m) for m in elf.needs]
        source = target.with_name(target.name + ".c")
        source.write_text(_source(elf, needed))
        args: list[str | Path] = [
            "musl-gcc" if elf.musl else "gcc",
            "-fPIC",
            source,
            "-o",
            target,
            "-Wl,--no-as-needed",
        ]
        if not elf.program:
            args += ["-shared", f"-Wl,-soname,{elf.soname}"]
        if elf.module:
            args += ["-I", PY_INCLUDE]
        for dep in needed:
            folder = (out / dep.member).parent
            args += [f"-L{folder}", f"-l:{dep.soname}", f"-Wl,-rpath-link,{folder}"]
        if elf.rpath:
            args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{elf.rpath.format(build=out)}"]
        if elf.runpath:
            args += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{elf.runpath.format(build=out)}"]
        run(args)
        built[elf.member] = target
    return built
