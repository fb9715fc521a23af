"""ROCm from pip packages (AMD's TheRock): what a ``wheels`` line changes in each stage.

TheRock installs ROCm as sibling packages in site-packages (``_rocm_sdk_core``,
``_rocm_sdk_libraries``, ...). A wheel built on such a line carries no ROCm and no absolute
ROCm folder: repair points its ELF files at the packages' library folders through
``$ORIGIN``-relative RPATHs (the linked-package mechanism of :mod:`.rocm_policy`), and the
wheel declares the ROCm packages in ``Requires-Dist`` so pip brings them along.
"""

from __future__ import annotations

import json
import posixpath
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from packaging.requirements import Requirement

from pipeline.config.lock import Line
from pipeline.errors import RocwheelsError
from pipeline.repair.policy import rocm_patterns
from pipeline.util.cmd import run
from pipeline.wheel.elf import ElfError, read_elf

# The library folders of TheRock's packages, relative to site-packages, in the order PyTorch's
# own repair lists them for its TheRock wheels (pytorch/pytorch@029219f47bcecd868b41b0966f6c23c55909da8c
# .ci/manywheel/repair_wheel.py, rocm_rpaths()). rocm_sysdeps holds the system libraries ROCm
# needs (libnuma, libelf, libdrm ...), shipped inside the core package.
LIBRARY_FOLDERS = (
    "_rocm_sdk_core/lib",
    "_rocm_sdk_core/lib/rocm_sysdeps/lib",
    "_rocm_sdk_libraries/lib",
)
# Where the builder image keeps the ROCm packages' wheel files (docker/builder/provision.sh).
BUILDER_ROCM_WHEELS = "/opt/rocm-sdk/wheels"
# The distribution each folder comes from, for people reading `inspect` and `doctor`.
FOLDER_PACKAGES = {
    "_rocm_sdk_core/lib": "rocm-sdk-core",
    "_rocm_sdk_core/lib/rocm_sysdeps/lib": "rocm-sdk-core (sysdeps)",
    "_rocm_sdk_libraries/lib": "rocm-sdk-libraries",
}


def link_packages(line: Line) -> tuple[str, ...]:
    """``link_packages`` entries that send every ROCm library to the ROCm packages' folders.

    Every folder gets every ROCm pattern, as PyTorch gives every file all three RPATH entries:
    which package holds which library changes between ROCm releases.
    """
    return package_links() if line.rocm_provider == "wheels" else ()


def package_links() -> tuple[str, ...]:
    patterns = ",".join(rocm_patterns())
    return tuple(f"{folder}:{patterns}" for folder in LIBRARY_FOLDERS)


def requires_dist(line: Line) -> tuple[str, ...]:
    """What a wheel of ``line`` must declare so that pip installs its ROCm too."""
    return line.rocm_wheels.requires if line.rocm_wheels else ()


def index_urls(line: Line) -> tuple[str, ...]:
    """The index pip needs besides the team's own to install wheels of ``line``."""
    return (line.rocm_wheels.index_url,) if line.rocm_wheels else ()


def rocm_sdk_env(rocm_sdk: Path | str, path: str, *, log_file: Path | None = None) -> dict[str, str]:
    """The build environment the installed ROCm packages describe (``rocm-sdk path``): ROCM_PATH,
    ROCM_HOME and HIP_PATH the root (the devel package, as vLLM 0.34.0's docker/Dockerfile.rocm_base
    sets them), CMAKE_PREFIX_PATH its CMake folder, its bin first on PATH."""

    def ask(option: str) -> str:
        return run([rocm_sdk, "path", option], log_file=log_file, quiet=True).output.strip()

    root = ask("--root")
    return {
        "ROCM_PATH": root,
        "ROCM_HOME": root,
        "HIP_PATH": root,
        "CMAKE_PREFIX_PATH": ask("--cmake"),
        "PATH": f"{ask('--bin')}:{path}",
    }


def constraint_pins(line: Line) -> tuple[str, ...]:
    """The ROCm requirements as constraints-file lines (``rocm==10.0.0``: constraints take no extras)."""
    requirements = map(Requirement, line.rocm_wheels.requires if line.rocm_wheels else ())
    return tuple(f"{r.name}{r.specifier}" for r in requirements)


def mirror(
    line_name: str, line: Line, dest: Path, *, with_build: bool = False, log_file: Path | None = None
) -> tuple[Path, ...]:
    """Download the wheels of ``line``'s ROCm packages (and what they pull in) from its index into
    ``dest`` - the folder a private index serves (``rocwheels serve --packages``) - and return the
    new files. ``with_build`` adds the builder's packages (the devel extra) too."""
    if line.rocm_wheels is None:
        raise RocwheelsError(
            f'line {line_name} takes ROCm from the machine (rocm_provider = "system"): there are no ROCm wheels to mirror',
            fix='pick a line with rocm_provider = "wheels" (rocwheels lock check lists the lines)',
        )
    requirements = (*line.rocm_wheels.requires, *(line.rocm_wheels.build if with_build else ()))
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    # Into a scratch folder first, so a failed download leaves nothing half-written in dest.
    with tempfile.TemporaryDirectory(prefix=".rocwheels-mirror-", dir=dest) as scratch:
        for python in line.python:
            target = [
                "--python-version",
                python,
                "--only-binary",
                ":all:",
                *(["--platform", line.platform] if line.platform else []),
            ]
            run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--disable-pip-version-check",
                    "--dest",
                    scratch,
                    "--index-url",
                    line.rocm_wheels.index_url,
                    *target,
                    *requirements,
                ],
                log_file=log_file,
            )
        for wheel in Path(scratch).glob("*.whl"):
            wheel.replace(dest / wheel.name)
    return tuple(sorted(set(dest.glob("*.whl")) - before))


def package_of(folder: str) -> str | None:
    """The ROCm distribution a site-packages folder belongs to, or None if it is no ROCm package's."""
    return FOLDER_PACKAGES.get(posixpath.normpath(folder))


def loaded_from_packages_check(sonames: Iterable[str], imports: Iterable[str]) -> str:
    """Python code, run in the venv the wheel was installed into: every ROCm library the wheel
    needs exists in the installed ROCm packages, and those the imports load come from there
    (``/proc/self/maps``), not from a ROCm of the machine."""
    return _CHECK.format(
        sonames=json.dumps(sorted(set(sonames))),
        folders=json.dumps(LIBRARY_FOLDERS),
        imports="; ".join(f"import {name}" for name in imports) or "pass",
    )


# Kept as a template: it runs in the smoke venv, whose Python need not be rocwheels'.
_CHECK = """
import os, sysconfig
site = sysconfig.get_paths()["platlib"]
folders = [os.path.join(site, f) for f in {folders}]
missing = [s for s in {sonames} if not any(os.path.exists(os.path.join(f, s)) for f in folders)]
assert not missing, f"not in the installed ROCm packages ({{', '.join(folders)}}): {{', '.join(missing)}}"
{imports}
mapped = {{line.split()[-1] for line in open("/proc/self/maps") if len(line.split()) >= 6}}
for soname in {sonames}:
    paths = [p for p in mapped if os.path.basename(p).startswith(soname)]
    outside = [p for p in paths if not any(os.path.realpath(p).startswith(os.path.realpath(f) + os.sep) for f in folders)]
    assert not outside, f"{{soname}} was loaded from {{outside}}, not from the ROCm packages"
    if paths:
        print("loaded", soname, "from", paths[0])
"""


def torch_provider(search_path: Sequence[str]) -> tuple[str, str] | None:
    """Where the first ``torch`` package on ``search_path`` (``sys.path``) takes ROCm from:
    ``(provider, detail)`` with provider ``wheels``, ``system``, ``bundled`` or ``none``; None
    when no torch is installed there. Reads the RPATHs of torch's libraries; never imports torch."""
    torch = next(
        (Path(entry) / "torch" for entry in search_path if (Path(entry) / "torch" / "__init__.py").is_file()), None
    )
    if torch is None:
        return None
    for library in sorted((*torch.glob("_C*.so"), *(torch / "lib").glob("*.so*"))):
        try:
            info = read_elf(library, with_fatbin=False)
        except ElfError:
            continue
        hip = next((name for name in info.needed if name.startswith("libamdhip64.so")), None)
        if hip is None:
            continue
        origin = library.parent
        for entry in info.runpath or info.rpath:
            folder = Path(entry.replace("${ORIGIN}", str(origin)).replace("$ORIGIN", str(origin))).resolve()
            if not (folder / hip).exists():
                continue
            relative = _relative_to(folder, torch.parent)
            if relative is not None and (package := package_of(relative)) is not None:
                return "wheels", f"{hip} from {package} ({folder}){_package_version(torch.parent, package)}"
            if folder == torch / "lib":
                return "bundled", f"{hip} inside torch/lib (PyTorch's own ROCm wheels carry their ROCm)"
            return "system", f"{hip} from {folder}"
        return "system", f"{hip} from the loader's default folders (no RPATH entry of {library.name} holds it)"
    return "none", f"{torch} is not a ROCm build (no library needs the HIP runtime)"


def _relative_to(folder: Path, site_packages: Path) -> str | None:
    try:
        return folder.relative_to(site_packages.resolve()).as_posix()
    except ValueError:
        return None


def _package_version(site_packages: Path, package: str) -> str:
    name = package.split(" ")[0].replace("-", "_")
    found = sorted(site_packages.glob(f"{name}-*.dist-info"))
    return f", version {found[0].name.removeprefix(name + '-').removesuffix('.dist-info')}" if found else ""
