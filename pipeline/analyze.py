"""What is inside a wheel: its ELF files, the libraries they need and where those would come from.

Shared by ``inspect`` (shows it) and ``verify`` (judges it). Resolution follows the dynamic
loader in the *target* layout: the wheel unpacked in site-packages, ROCm's library folder on
the host, and the packages the recipe links against (torch's ``torch/lib``).
"""

from __future__ import annotations

import json
import posixpath
import re
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cache
from importlib import resources
from pathlib import Path

from .elf import ELF_MAGIC, ElfInfo, read_elf
from .offload import OffloadBundleError, gpu_targets, parse_fatbin
from .rocm_policy import LinkPackage, RocmPolicy, load_policy
from .wheelfile import WheelInfo, check_wheel, extract, open_wheel

# Folders the loader searches without being told (ld.so.cache and the built-in defaults).
DEFAULT_LIBRARY_DIRS = ("/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
_DATA_DIR = re.compile(r"^[^/]+\.data/(purelib|platlib)/")


class Kind(str, Enum):
    BUNDLED = "bundled"  # inside this wheel
    ROCM = "rocm"  # ROCm's, from the host's ROCm library folder
    PACKAGE = "package"  # from another installed package (torch/lib)
    SYSTEM = "system"  # a manylinux system library (libc, libstdc++ ...)
    MISSING = "missing"


@dataclass(frozen=True)
class Dependency:
    soname: str
    kind: Kind
    location: str | None  # the member or folder it resolves to; None when it would not load
    note: str = ""


@dataclass(frozen=True)
class ElfMember:
    name: str  # member name in the archive
    install_path: str  # relative to site-packages
    soname: str | None
    search_path: tuple[str, ...]  # RUNPATH, else RPATH, entries as written
    dependencies: tuple[Dependency, ...]
    gpu_targets: tuple[str, ...] = ()
    bundles: int = 0
    compression: tuple[str, ...] = ()
    fatbin_error: str | None = None
    amdgpu_processor: str | None = None  # a standalone GPU code object


@dataclass(frozen=True)
class TargetLayout:
    """Where excluded libraries come from on the machine that installs the wheel."""

    rocm_lib_dir: str | None = "/opt/rocm/lib"  # None: ROCm from pip packages, among link_packages
    link_packages: tuple[LinkPackage, ...] = ()  # torch's libraries from site-packages/torch/lib
    policy: RocmPolicy = field(default_factory=load_policy)


@dataclass(frozen=True)
class WheelAnalysis:
    info: WheelInfo
    members: tuple[ElfMember, ...]
    layout: TargetLayout


@cache
def system_libraries() -> frozenset[str]:
    """Sonames every manylinux policy lets a wheel take from the system (auditwheel's own data)."""
    text = resources.files("auditwheel").joinpath("policy/manylinux-policy.json").read_text()
    return frozenset(lib for policy in json.loads(text) for lib in policy.get("lib_whitelist", ()))


def analyze_wheel(path: Path, layout: TargetLayout | None = None) -> WheelAnalysis:
    layout = layout or TargetLayout()
    info = check_wheel(path)
    with open_wheel(path) as archive, tempfile.TemporaryDirectory(prefix="rocwheels-analyze-") as scratch:
        elf_names = [n for n in archive.namelist() if not n.endswith("/") and _starts_with_elf_magic(archive, n)]
        raw = []
        for name in elf_names:
            extracted = extract(archive, [name], Path(scratch))[name]
            elf = read_elf(extracted)
            # Summarise the GPU code now and drop its bytes: a torch wheel holds gigabytes of it.
            raw.append((name, replace(elf, hip_fatbin=None), _code_objects(elf.hip_fatbin)))
            extracted.unlink()  # one large library at a time on disk
    installed = {_install_path(name): elf for name, elf, _ in raw}
    by_folder: dict[str, dict[str, str]] = {}
    for path, elf in installed.items():
        names = by_folder.setdefault(posixpath.dirname(path), {})
        names.setdefault(posixpath.basename(path), path)
        if elf.soname:
            names.setdefault(elf.soname, path)
    members = tuple(_member(name, _install_path(name), elf, code, installed, by_folder, layout) for name, elf, code in raw)
    return WheelAnalysis(info, members, layout)


def _starts_with_elf_magic(archive: zipfile.ZipFile, name: str) -> bool:
    with archive.open(name) as stream:
        return stream.read(len(ELF_MAGIC)) == ELF_MAGIC


def _install_path(member: str) -> str:
    return _DATA_DIR.sub("", member)


@dataclass(frozen=True)
class _CodeObjects:
    targets: tuple[str, ...] = ()
    bundles: int = 0
    compression: tuple[str, ...] = ()
    error: str | None = None


def _code_objects(fatbin: bytes | None) -> _CodeObjects:
    if fatbin is None:
        return _CodeObjects()
    try:
        parsed = parse_fatbin(fatbin)
    except OffloadBundleError as exc:
        return _CodeObjects(error=str(exc))
    return _CodeObjects(gpu_targets(parsed), len(parsed), tuple(sorted({b.compression or "none" for b in parsed})))


def _member(name: str, install_path: str, elf: ElfInfo, code: _CodeObjects, installed: dict[str, ElfInfo],
            by_folder: dict[str, dict[str, str]], layout: TargetLayout) -> ElfMember:
    # The loader ignores RPATH when RUNPATH is present.
    search_path = elf.runpath or elf.rpath
    folders = [expand_origin(entry, posixpath.dirname(install_path)) for entry in search_path]
    dependencies = tuple(_resolve(soname, folders, by_folder, installed, layout) for soname in elf.needed)
    return ElfMember(name, install_path, elf.soname, tuple(search_path), dependencies, code.targets, code.bundles,
                     code.compression, code.error, elf.amdgpu_processor)


def expand_origin(entry: str, origin: str) -> str:
    """A search-path entry as a folder: relative to site-packages for $ORIGIN, else absolute."""
    for token in ("$ORIGIN", "${ORIGIN}"):
        if entry.startswith(token):
            return posixpath.normpath(posixpath.join(origin, entry[len(token):].lstrip("/")) or ".")
    return entry


def _resolve(soname: str, folders: Sequence[str], by_folder: dict[str, dict[str, str]], installed: dict[str, ElfInfo], layout: TargetLayout) -> Dependency:
    for folder in folders:
        found = by_folder.get(folder, {}).get(soname)
        if found:
            return Dependency(soname, Kind.BUNDLED, found)
    # ROCm from pip packages (TheRock), when the layout names their folders: for a `wheels` line
    # (rocm_lib_dir None) one of them must be on the search path.
    rocm_packages = [link.lib_dir for link in layout.link_packages if link.provides(soname)] if layout.policy.is_rocm(soname) else []
    reached = next((f for f in rocm_packages if f in folders), None)
    if reached or (rocm_packages and layout.rocm_lib_dir is None):
        return Dependency(soname, Kind.ROCM, reached, "" if reached else f"the search path reaches none of the ROCm packages' folders {', '.join(rocm_packages)}")
    if layout.policy.is_rocm(soname):
        reachable = [f for f in folders if f == layout.rocm_lib_dir] or [d for d in DEFAULT_LIBRARY_DIRS if d == layout.rocm_lib_dir]
        if reachable:
            return Dependency(soname, Kind.ROCM, layout.rocm_lib_dir)
        return Dependency(soname, Kind.ROCM, None, f"the search path lacks the ROCm library folder {layout.rocm_lib_dir}")
    providers = [link.lib_dir for link in layout.link_packages if link.provides(soname)]
    if providers:
        if any(folder in folders for folder in providers):
            return Dependency(soname, Kind.PACKAGE, next(f for f in providers if f in folders))
        return Dependency(soname, Kind.PACKAGE, None, f"the search path does not reach {', '.join(providers)}")
    if soname in system_libraries() or soname.startswith("ld-linux"):
        return Dependency(soname, Kind.SYSTEM, "system")
    elsewhere = [path for path, elf in installed.items() if posixpath.basename(path) == soname or elf.soname == soname]
    note = f"in the wheel at {elsewhere[0]}, but not on this file's search path" if elsewhere else "not in the wheel, not ROCm's, not a system library"
    return Dependency(soname, Kind.MISSING, None, note)

