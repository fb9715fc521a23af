"""What is inside a wheel: its ELF files, the libraries they need and where those would come from.

Shared by ``inspect`` (shows it) and ``verify`` (judges it). Resolution follows the dynamic
loader (glibc's or musl's rules, see :class:`Loader`) in the *target* layout: the wheel unpacked
in site-packages, ROCm's library folder on the host, and the packages the recipe links against
(torch's ``torch/lib``). tests/test_loader.py holds it to what the real loader does.
"""

from __future__ import annotations

import mmap
import posixpath
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cache, partial
from pathlib import Path

from pipeline.config.toolchain import rocm_lib_dir
from pipeline.repair.policy import LinkPackage, RocmPolicy, load_policy
from pipeline.wheel.archive import WheelInfo, read_wheel
from pipeline.wheel.elf import ELF_MAGIC, ElfError, ElfInfo, read_elf, section_span
from pipeline.wheel.offload import OffloadBundleError, gpu_targets, parse_fatbin
from pipeline.wheel.platform_tag import symbol_versions

# Folders glibc's loader searches without being told (ld.so.cache and its built-in defaults).
DEFAULT_LIBRARY_DIRS = (
    "/lib",
    "/usr/lib",
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
)
# musl's: its built-in default, then what Debian's musl lists in /etc/ld-musl-x86_64.path.
MUSL_LIBRARY_DIRS = ("/lib", "/usr/local/lib", "/usr/lib", "/lib/x86_64-linux-musl", "/usr/lib/x86_64-linux-musl")
_DATA_DIR = re.compile(r"^[^/]+\.data/(purelib|platlib)/")
# The largest page-cache folio a fault may map at once (a PMD: 2 MiB on x86-64).
_FOLIO_REACH = 2 << 20


class Kind(StrEnum):
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
    symbol_versions: tuple[tuple[str, str], ...] = ()  # (library, version) it needs: ("libc.so.6", "GLIBC_2.34")


@dataclass(frozen=True)
class TargetLayout:
    """Where excluded libraries come from on the machine that installs the wheel."""

    rocm_lib_dir: str | None = rocm_lib_dir()  # None: ROCm from pip packages, among link_packages
    link_packages: tuple[LinkPackage, ...] = ()  # torch's libraries from site-packages/torch/lib
    policy: RocmPolicy = field(default_factory=load_policy)


@dataclass(frozen=True)
class WheelAnalysis:
    info: WheelInfo
    members: tuple[ElfMember, ...]
    layout: TargetLayout


class Libc(StrEnum):
    GLIBC = "glibc"
    MUSL = "musl"


@dataclass(frozen=True)
class Loader:
    """How one C library's dynamic loader searches for a NEEDED library (never LD_LIBRARY_PATH:
    the build host's is no part of the machine that installs the wheel).

    glibc: the DT_RPATH of the loading object and of each object above it in the loading chain,
    but only while the loading object has no DT_RUNPATH (an object with DT_RUNPATH has no
    DT_RPATH); then its DT_RUNPATH, which is never inherited; then the system folders.
    musl: the search path (DT_RUNPATH, else DT_RPATH) of the loading object and of every object
    above it, then the system folders.
    """

    libc: Libc
    system_dirs: tuple[str, ...]

    def search_folders(self, chain: Sequence[tuple[str, ElfInfo]]) -> list[str]:
        """Folders searched for a library needed by ``chain[0]``, loaded through ``chain[1:]``.

        Each ``(install path, ElfInfo)``; ``$ORIGIN`` is the folder of the object whose entry it is.
        """

        def folders(path: str, entries: Sequence[str]) -> list[str]:
            return [expand_origin(entry, posixpath.dirname(path)) for entry in entries]

        path, elf = chain[0]
        if self.libc is Libc.MUSL:
            return [f for above, info in chain for f in folders(above, info.runpath or info.rpath)]
        inherited = (
            [] if elf.runpath else [f for above, info in chain if not info.runpath for f in folders(above, info.rpath)]
        )
        return inherited + folders(path, elf.runpath)


GLIBC_LOADER = Loader(Libc.GLIBC, DEFAULT_LIBRARY_DIRS)
MUSL_LOADER = Loader(Libc.MUSL, MUSL_LIBRARY_DIRS)


@cache
def system_libraries(libc: Libc = Libc.GLIBC) -> frozenset[str]:
    """Sonames a wheel may take from the system: every policy's whitelist (auditwheel's own data)."""
    from auditwheel.architecture import Architecture
    from auditwheel.libc import Libc as AuditwheelLibc
    from auditwheel.policy import WheelPolicies

    if libc is Libc.MUSL:
        policies = WheelPolicies(libc=AuditwheelLibc.MUSL, arch=Architecture.x86_64, musl_policy="musllinux_1_2")
        # musl-gcc outside Alpine links plain libc.so; musl's loader answers for it itself.
        return frozenset({"libc.so", *(lib for policy in policies for lib in policy.whitelist)})
    policies = WheelPolicies(libc=AuditwheelLibc.GLIBC, arch=Architecture.x86_64)
    return frozenset(lib for policy in policies for lib in policy.whitelist)


def libc_of(elfs: Sequence[ElfInfo]) -> Libc:
    """musl when any file links musl's C library (musl-gcc: libc.so; Alpine: libc.musl-<arch>.so.1)."""
    musl = any(n == "libc.so" or n.startswith("libc.musl-") for elf in elfs for n in elf.needed)
    return Libc.MUSL if musl else Libc.GLIBC


def analyze_wheel(path: Path, layout: TargetLayout | None = None) -> WheelAnalysis:
    layout = layout or TargetLayout()
    # One pass over the members: each is inflated once, hashed, and an ELF file also read as it lands.
    info, read = read_wheel(path, lambda head: head.startswith(ELF_MAGIC), partial(_read_member, path))
    raw = [(name, *found) for name, found in read.items()]
    installed = {_install_path(name): elf for name, elf, _, _ in raw if elf.machine != "EM_AMDGPU"}
    loader = MUSL_LOADER if libc_of(list(installed.values())) is Libc.MUSL else GLIBC_LOADER
    resolved = _Resolver(installed, layout, loader).resolve_all()
    members = tuple(
        ElfMember(
            name,
            _install_path(name),
            elf.soname,
            tuple(elf.runpath or elf.rpath),
            resolved.get(_install_path(name), ()),
            code.targets,
            code.bundles,
            code.compression,
            code.error,
            elf.amdgpu_processor,
            versions,
        )
        for name, elf, code, versions in raw
    )
    return WheelAnalysis(info, members, layout)


class _Resolver:
    """Loads each entry point of a wheel the way the loader would, breadth first, and records
    where every NEEDED entry of every file loaded on the way comes from.

    Entry points are the ELF files no other file of the wheel needs (extensions, programs,
    dlopen()ed plugins). A file loaded through several entry points is judged by the worst of
    them: each entry point may be the first one a process loads.
    """

    def __init__(self, installed: dict[str, ElfInfo], layout: TargetLayout, loader: Loader) -> None:
        self.installed = installed
        self.layout = layout
        self.loader = loader
        self.system = system_libraries(loader.libc)
        self.by_folder: dict[str, dict[str, str]] = {}
        for path, elf in installed.items():
            names = self.by_folder.setdefault(posixpath.dirname(path), {})
            names.setdefault(posixpath.basename(path), path)
            if elf.soname:
                names.setdefault(elf.soname, path)

    def resolve_all(self) -> dict[str, tuple[Dependency, ...]]:
        needed_inside = {n for elf in self.installed.values() for n in elf.needed}
        roots = [
            p
            for p, elf in self.installed.items()
            if posixpath.basename(p) not in needed_inside and elf.soname not in needed_inside
        ]
        verdicts: dict[str, dict[str, Dependency]] = {}
        for root in roots:
            self._load(root, verdicts)
        for path in self.installed:  # files only reachable from each other (a cycle) load on their own
            if path not in verdicts:
                self._load(path, verdicts)
        return {path: tuple(deps[soname] for soname in self.installed[path].needed) for path, deps in verdicts.items()}

    def _load(self, root: str, verdicts: dict[str, dict[str, Dependency]]) -> None:
        loaded: dict[str, Dependency] = {}  # soname -> where the process got it
        queue: deque[tuple[str, ...]] = deque([(root,)])  # a file and the files above it
        seen = {root}
        while queue:
            chain = queue.popleft()
            elf = self.installed[chain[0]]
            own = verdicts.setdefault(chain[0], {})
            for soname in elf.needed:
                dep = loaded.get(soname) or self._search(soname, chain)
                if dep.location is not None:
                    loaded[soname] = dep
                elif len(chain) > 1:
                    dep = replace(dep, note=f"{dep.note} (loaded through {' <- '.join(chain[1:])})")
                if soname not in own or own[soname].location is not None:
                    own[soname] = dep
                if dep.kind is Kind.BUNDLED and dep.location is not None and dep.location not in seen:
                    seen.add(dep.location)
                    queue.append((dep.location, *chain))

    def _search(self, soname: str, chain: tuple[str, ...]) -> Dependency:
        layout = self.layout
        folders = self.loader.search_folders([(p, self.installed[p]) for p in chain])
        for folder in (*folders, *self.loader.system_dirs):
            found = self.by_folder.get(folder, {}).get(soname)
            if found:
                return Dependency(soname, Kind.BUNDLED, found)
            if folder == layout.rocm_lib_dir and layout.policy.is_rocm(soname):
                return Dependency(soname, Kind.ROCM, folder)
            if any(link.lib_dir == folder and link.provides(soname) for link in layout.link_packages):
                # ROCm from pip packages (TheRock) is still ROCm: never grafted, resolved in site-packages.
                return Dependency(soname, Kind.ROCM if layout.policy.is_rocm(soname) else Kind.PACKAGE, folder)
        if soname in self.system or soname.startswith(("ld-linux", "ld-musl")):
            return Dependency(soname, Kind.SYSTEM, "system")
        providers = [link.lib_dir for link in layout.link_packages if link.provides(soname)]
        if layout.policy.is_rocm(soname):
            if layout.rocm_lib_dir is None:  # a `wheels` line: ROCm lives in pip packages
                return Dependency(
                    soname,
                    Kind.ROCM,
                    None,
                    f"the search path reaches none of the ROCm packages' folders {', '.join(providers)}",
                )
            return Dependency(
                soname, Kind.ROCM, None, f"the search path lacks the ROCm library folder {layout.rocm_lib_dir}"
            )
        if providers:
            return Dependency(soname, Kind.PACKAGE, None, f"the search path does not reach {', '.join(providers)}")
        elsewhere = [p for p, elf in self.installed.items() if posixpath.basename(p) == soname or elf.soname == soname]
        note = (
            f"in the wheel at {elsewhere[0]}, but not on this file's search path"
            if elsewhere
            else "not in the wheel, not ROCm's, not a system library"
        )
        return Dependency(soname, Kind.MISSING, None, note)


def _install_path(member: str) -> str:
    return _DATA_DIR.sub("", member)


def _read_member(wheel: Path, name: str, file: Path) -> tuple[ElfInfo, _CodeObjects, tuple[tuple[str, str], ...]]:
    """What analysis needs of the ELF member ``name``, unpacked to ``file``."""
    try:
        elf = read_elf(file, with_fatbin=False)
        versions = symbol_versions(file)
    except ElfError as exc:  # named by its member, not by the scratch copy
        raise ElfError(
            f"{wheel}: {name}: {exc.message.removeprefix(f'{file}: ')}",
            fix="do not install or publish this wheel: the loader would crash on it; rebuild it",
        ) from None
    # The GPU code is streamed from a mapping of the file, never held: a torch wheel holds gigabytes of it.
    return elf, _code_objects(file), versions


@dataclass(frozen=True)
class _CodeObjects:
    targets: tuple[str, ...] = ()
    bundles: int = 0
    compression: tuple[str, ...] = ()
    error: str | None = None


def _code_objects(path: Path) -> _CodeObjects:
    try:
        span = section_span(path, ".hip_fatbin")
    except ElfError as exc:
        return _CodeObjects(error=exc.message)
    if span is None or span[1] == 0:
        return _CodeObjects()
    offset, size = span
    released = offset  # in the file: pages before it have left this process
    with path.open("rb") as stream, mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ) as mapped:

        def release(end: int) -> None:
            # Pages already read leave this process (they stay in the page cache). Touching one page
            # may map the rest of its page-cache folio, up to 2 MiB behind it: drop that far back.
            nonlocal released
            first = max(released - _FOLIO_REACH, 0) // mmap.PAGESIZE * mmap.PAGESIZE
            released = min(offset + end, len(mapped))
            mapped.madvise(mmap.MADV_DONTNEED, first, released - first)

        with memoryview(mapped) as view, view[offset : offset + size] as section:
            try:
                parsed = parse_fatbin(section, release)
            except OffloadBundleError as exc:
                return _CodeObjects(error=str(exc))
    return _CodeObjects(gpu_targets(parsed), len(parsed), tuple(sorted({b.compression or "none" for b in parsed})))


def expand_origin(entry: str, origin: str) -> str:
    """A search-path entry as a folder: relative to site-packages for $ORIGIN, else absolute."""
    for token in ("$ORIGIN", "${ORIGIN}"):
        if entry.startswith(token):
            return posixpath.normpath(posixpath.join(origin, entry[len(token) :].lstrip("/")) or ".")
    return entry
