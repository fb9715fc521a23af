"""The one adapter to auditwheel: its verdict on a wheel, its grafts, and its failures explained.

auditwheel decides what is grafted and which platform tag a wheel earns. rocwheels asks it through
its library API: ``wheel_abi.analyze_wheel_abi``, its policies and ``lddtree`` for the verdict, and,
where something must be grafted, ``repair.repair_wheel`` with that same analysis (what ``auditwheel
repair`` runs after analysing), for the auditwheel versions ``pyproject.toml`` allows.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import auditwheel.wheeltools
from auditwheel.error import NonPlatformWheelError, WheelToolsError
from auditwheel.lddtree import ldd, load_ld_paths
from auditwheel.patcher import ElfPatcher, ElfUpdateInfo
from auditwheel.repair import repair_wheel
from auditwheel.wheel_abi import WheelAbIInfo, analyze_wheel_abi
from auditwheel.wheeltools import get_wheel_architecture, get_wheel_libc

from pipeline.errors import RocwheelsError
from pipeline.repair.auditwheel_symbols import read_once
from pipeline.util.files import link_files
from pipeline.util.interrupts import SIGNALS, held_while
from pipeline.wheel.elf import read_elf
from pipeline.wheel.rpath import edit_in_place

if TYPE_CHECKING:
    from auditwheel.policy import Policy

_FIX_MISSING = (
    "exclude {library} in the recipe's [repair] exclude if the target machine provides it, "
    "or install it in the builder (or put its folder on LD_LIBRARY_PATH) so it is grafted"
)

T = TypeVar("T")
# Called only when a library is missing: the wheel's ELF files as (member, extracted path, NEEDED).
WhoNeeds = Callable[[], Sequence[tuple[str, Path, Sequence[str]]]]


def tool_env() -> dict[str, str]:
    """PATH with rocwheels' own scripts folder first.

    auditwheel runs patchelf from PATH; patchelf comes with rocwheels' own environment, whose
    scripts folder is not on PATH unless that environment is activated.
    """
    return {"PATH": os.pathsep.join(filter(None, (sysconfig.get_path("scripts"), os.environ.get("PATH"))))}


@dataclass(frozen=True)
class Verdict:
    """What auditwheel says of a wheel: the platform tag it earns, and what its repair would change."""

    tag: str  # PEP 600 spelling: manylinux_2_28_x86_64
    # member -> sonames auditwheel would graft into it (or, for libpython, drop); empty: nothing to do
    grafts: dict[str, tuple[str, ...]]


class AnalysisAside:
    """auditwheel's verdict in a process of its own, started on entering (its imports overlap the caller's
    work): the caller patches and deflates meanwhile, and auditwheel's pure-Python analysis does
    not compete with it for the GIL (as it would in a thread: benchmarks/README.md). Leaving waits
    for it, or, on an error, stops it; its temporary files go into ``temp`` (the caller's, removed
    after)."""

    def __init__(self, temp: Path) -> None:
        self._temp = temp

    def __enter__(self) -> AnalysisAside:
        # Signals wait until the process has started (one stopping the start would leave it reading
        # half its start-up data, and printing a traceback); the process ignores them: on the way
        # out it is stopped here.
        try:
            with held_while():
                self._pool = ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start,
                    initargs=(str(self._temp),),
                )
                self._pool.submit(_ready)
        except BaseException:
            if hasattr(self, "_pool"):
                self.__exit__(RuntimeError)
            raise
        return self

    def __exit__(self, failure: type[BaseException] | None, *_: object) -> None:
        if failure is not None:  # its verdict is no longer wanted: do not wait for it
            # (ProcessPoolExecutor.terminate_workers arrives with Python 3.14)
            for process in list(self._pool._processes.values()):
                process.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def submit(
        self,
        wheel: Path,
        members: Sequence[str],
        excludes: Sequence[str],
        plat: str | None,
        *,
        who_needs: WhoNeeds,
    ) -> Callable[[], Verdict]:
        """Start auditwheel's verdict on ``wheel`` (whose ELF ``members`` are listed), as ``repair --plat``
        sees it; the function returned waits for it (or raises its error). ``wheel`` is a wheel file,
        or a folder named like one that holds its files unpacked (linked, not copied, for auditwheel).

        The tag is one the contents allow: without ``plat`` the best one auditwheel finds, with it
        only if no symbol version, ISA level or blacklisted symbol forbids it (else an error)."""
        outcome = self._run(_judge, wheel, tuple(members), tuple(excludes), plat)
        return lambda: _verdict(wheel, self._answer(outcome), who_needs)

    def graft(self, judged: Path, part: Path, out: Path, stand_ins: Mapping[str, Path]) -> tuple[Path, set[str]]:
        """auditwheel's repair, with its analysis of the wheel ``judged`` (the last ``submit``, whose
        verdict grafts), of ``part``: a wheel of the ELF files the verdict names, from that wheel,
        where each member of ``stand_ins`` is an empty stand-in for the file it names, edited in its
        place. Written into folder ``out``: (the wheel it wrote, to take the changed and new files
        from; the members of ``stand_ins`` whose file was edited).

        The analysis is not run again (``auditwheel repair`` would), and the large files are
        neither unpacked nor zipped again."""
        return self._answer(self._run(_graft, judged, part, out, {name: str(path) for name, path in stand_ins.items()}))

    def _run(self, work: Callable[..., T], *args: object) -> Future[T]:
        try:
            return self._pool.submit(work, *args)
        except BrokenProcessPool:
            raise _analysis_stopped() from None

    @staticmethod
    def _answer(outcome: Future[T]) -> T:
        try:
            return outcome.result()
        except BrokenProcessPool:
            raise _analysis_stopped() from None
        except RocwheelsError:
            raise
        except Exception as exc:  # auditwheel reads ELF files rocwheels' checks let through; it crashes on damage
            raise RocwheelsError(
                f"auditwheel could not analyse the wheel ({type(exc).__name__}: {exc}); an ELF file in it is likely damaged",
                fix="run `rocwheels inspect` on the wheel to see which file, and rebuild the wheel",
            ) from None


def _analysis_stopped() -> RocwheelsError:
    return RocwheelsError(
        "auditwheel's analysis process stopped before it answered",
        fix='if rocwheels runs from a Python script of your own, put the call under `if __name__ == "__main__":` '
        "(the process starts with multiprocessing's spawn, which runs that script again); else run again",
    )


def _start(temp: str) -> None:
    os.environ["TMPDIR"] = tempfile.tempdir = temp
    os.environ.update(tool_env())  # for auditwheel's patcher
    for stop in SIGNALS:
        signal.signal(stop, signal.SIG_IGN)


def _ready() -> None:
    """Nothing: the first job of the analysis process, which imports this module (and auditwheel)."""


def _verdict(wheel: Path, outcome: Verdict | str, who_needs: WhoNeeds) -> Verdict:
    if isinstance(outcome, str):
        raise _missing(wheel, outcome, who_needs)
    return outcome


# The analysis process's last analysis whose verdict grafts (wheel -> (analysis, chosen policy)), for ``_graft``.
_ANALYSES: dict[str, tuple[WheelAbIInfo, Policy]] = {}


def _judge(wheel: Path, members: Sequence[str], excludes: Sequence[str], plat: str | None) -> Verdict | str:
    """``submit``'s work: the verdict, or the soname of a library that could not be located."""
    try:
        architecture = get_wheel_architecture(wheel.name)
    except (WheelToolsError, NonPlatformWheelError):
        architecture = None
    try:
        libc = get_wheel_libc(wheel.name)
    except WheelToolsError:
        libc = None
    base = plat.removesuffix(f"_{architecture.value}") if plat and architecture else plat
    # auditwheel reads LD_LIBRARY_PATH once per process (an lru_cache); a long-lived process may
    # have changed it since.
    load_ld_paths.cache_clear()
    try:
        with _auditwheel_quiet(), read_once(), _folder_linked():
            abi = analyze_wheel_abi(
                libc,
                architecture,
                wheel,
                frozenset(excludes),
                disable_isa_ext_check=False,
                allow_graft=True,
                requested_policy_base_name=base or "auto",
            )
    except NonPlatformWheelError:
        raise _no_compiled_code(wheel) from None
    except RuntimeError as exc:
        raise (_purelib(wheel) if "purelib" in str(exc) else _failed(wheel, str(exc))) from None
    policies = abi.policies
    if plat:
        try:
            policy = policies.get_policy_by_name(plat)
        except LookupError:
            raise RocwheelsError(
                f"cannot repair {wheel.name}: auditwheel knows no platform {plat!r}",
                fix="set the lock line's platform to a tag such as manylinux_2_28_x86_64",
            ) from None
    elif abi.overall_policy == policies.linux:
        # Only a missing library (reported below) may still lead to a manylinux tag. Contents that
        # allow linux_* only must not get auditwheel's automatic fallback, its newest manylinux tag.
        policy = policies.lowest
    else:
        policy = abi.overall_policy
    if policy > abi.sym_policy:
        raise _too_recent(wheel)
    for limit, why in (
        (abi.ucs_policy, "it was built against a UCS2 Python"),
        (abi.blacklist_policy, "it uses black-listed symbols"),
        (abi.machine_policy, "it uses ISA extensions the platform does not allow"),
    ):
        if policy > limit:
            raise RocwheelsError(
                f"cannot repair {wheel.name} to {policy.name}: {why}",
                fix="drop the plat setting, or rebuild in the line's builder image",
            )
    grafts: dict[str, tuple[str, ...]] = {}
    for path, references in abi.full_external_refs.items():
        libraries = references[policy.name].libs
        missing: list[str] = [
            soname for soname, found in libraries.items() if found is None and not soname.startswith("libpython")
        ]
        if missing:
            return missing[0]
        if libraries:
            grafts[_member(path, members)] = tuple(libraries)
    _ANALYSES.clear()
    if grafts:
        _ANALYSES[str(wheel)] = (abi, policy)
    return Verdict(policy.name, grafts)


@contextlib.contextmanager
def _auditwheel_quiet() -> Iterator[None]:
    """auditwheel's log at errors only: its warnings ("ignoring: Kernels.co with unknown
    architecture": GPU code objects) are noise here."""
    log = logging.getLogger("auditwheel")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _member(path: Path, members: Sequence[str]) -> str:
    """The member name of a file auditwheel unpacked (it names them relative to its folder)."""
    text = path.as_posix()
    return next(name for name in members if text == name or text.endswith(f"/{name}"))


def _graft(judged: Path, part: Path, out: Path, stand_ins: Mapping[str, str]) -> tuple[Path, set[str]]:
    """``graft``'s work: auditwheel's ``repair_wheel`` of ``part`` with the analysis of ``judged``."""
    abi, policy = _ANALYSES.pop(str(judged))
    # What `auditwheel repair --plat <tag> --only-plat` passes (its defaults: `.libs`, no strip), with
    # its patchelf patcher behind the in-place one.
    patcher = _InPlacePatcher(policy.name, {name: Path(path) for name, path in stand_ins.items()})
    try:
        with _auditwheel_quiet(), _stored_zip():
            written: Path | None = repair_wheel(
                abi,
                part,
                abis=[policy.name, *policy.aliases],
                lib_sdir=".libs",
                out_dir=out,
                update_tags=True,
                patcher=patcher,
                strip=False,
                zip_compression_level=0,  # unused: see _stored_zip
            )
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        raise _failed(judged, str(exc)) from None
    if written is None:
        raise _failed(judged, "auditwheel found nothing to graft after all")
    return written, patcher.edited


def _search_path(update: ElfUpdateInfo) -> list[str] | None:
    """The search path ``update`` sets ([] removes it), None when it leaves it."""
    rpath: str | None = update.rpath
    if rpath:
        return rpath.split(":")
    return [] if rpath is not None or update.clear_rpath else None


class _InPlacePatcher(ElfPatcher):  # type: ignore[misc]  # auditwheel ships no types
    """auditwheel's edits of the wheel's own ELF files made in place where
    :func:`pipeline.wheel.rpath.edit_in_place` can, else (and for the libraries it grafts) by
    auditwheel's patchelf patcher. patchelf reads and writes a file whole: jax-rocm60-pjrt's 534 MB
    library took 2.2 s and a 1.1 GB peak for a few changed bytes.

    The wheel's own files are stand-ins (the members of ``stand_ins``, empty in auditwheel's folder):
    an edit of one goes to the file it stands for."""

    def __init__(self, platform: str, stand_ins: Mapping[str, Path]) -> None:
        super().__init__(platform)
        self._patchelf = ElfPatcher.get_patcher("patchelf", platform)
        self._stand_ins = stand_ins
        self.edited: set[str] = set()

    def _target(self, path: Path) -> tuple[Path, str | None]:
        """The file an edit of ``path`` goes to, and the stand-in member it is for (if any).
        auditwheel edits inside the folder it unpacked the wheel into, its working folder."""
        member = os.path.relpath(path.resolve(), Path.cwd().resolve())
        return (self._stand_ins[member], member) if member in self._stand_ins else (path, None)

    def get_rpath_direct(self, file_name: Path) -> str:
        info = read_elf(self._target(file_name)[0], with_fatbin=False)
        return ":".join(info.runpath or info.rpath)  # patchelf --print-rpath's choice

    def apply_updates(self) -> None:
        for path in list(self._updates):
            update = self._updates.pop(path)
            target, member = self._target(path)
            # A grafted copy (small) gets patchelf's bytes, as auditwheel's own repair gives it.
            if (
                member is None
                or update.remove_needed
                or not edit_in_place(
                    target, rpath=_search_path(update), needed=dict(update.replace_needed), soname=update.soname
                )
            ):
                self._by_patchelf(target, update)
            if member is not None:
                self.edited.add(member)
        self._patchelf.apply_updates()

    def _by_patchelf(self, target: Path, update: ElfUpdateInfo) -> None:
        """``update`` made by auditwheel's patchelf patcher, through its public calls."""
        if update.soname is not None:
            self._patchelf.set_soname(target, update.soname)
        if update.remove_needed:
            self._patchelf.remove_needed(target, *update.remove_needed)
        if update.replace_needed:
            self._patchelf.replace_needed(target, *update.replace_needed)
        if update.rpath is not None:
            self._patchelf.set_rpath(target, update.rpath)
        elif update.clear_rpath:
            self._patchelf.clear_rpath(target)


@contextlib.contextmanager
def _folder_linked() -> Iterator[None]:
    """auditwheel's unpacking of a wheel that is a folder of its unpacked files (repair's): its files
    are linked into auditwheel's folder, not copied (:func:`link_files`). A zip is unpacked as ever."""
    replaced = auditwheel.wheeltools.zip2dir

    def zip2dir(zip_fname: Path, out_dir: Path) -> None:
        if not zip_fname.is_dir():
            replaced(zip_fname, out_dir)
            return
        files = (path for path in zip_fname.rglob("*") if not path.is_dir())
        link_files({path.relative_to(zip_fname).as_posix(): path for path in files}, out_dir)

    auditwheel.wheeltools.zip2dir = zip2dir
    try:
        yield
    finally:
        auditwheel.wheeltools.zip2dir = replaced


@contextlib.contextmanager
def _stored_zip() -> Iterator[None]:
    """auditwheel's repaired wheel written stored and streamed: it is only an intermediate, whose
    changed files rocwheels takes and deflates itself. auditwheel deflates (jax-rocm60-pjrt: a
    534 MB library, seconds of one core) and holds each file and its compressed copy in memory."""
    replaced = auditwheel.wheeltools.dir2zip

    def dir2zip(in_dir: Path, zip_fname: Path, zip_compression_level: int, date_time: object) -> None:
        with zipfile.ZipFile(zip_fname, "w", zipfile.ZIP_STORED) as archive:
            for folder, _, files in os.walk(in_dir):
                for name in sorted(files):
                    path = Path(folder, name)
                    with (
                        path.open("rb") as source,
                        archive.open(zipfile.ZipInfo.from_file(path, path.relative_to(in_dir).as_posix()), "w") as sink,
                    ):
                        shutil.copyfileobj(source, sink, 1 << 20)

    auditwheel.wheeltools.dir2zip = dir2zip
    try:
        yield
    finally:
        auditwheel.wheeltools.dir2zip = replaced


def _missing(wheel: Path, library: str, who_needs: WhoNeeds) -> RocwheelsError:
    return RocwheelsError(
        f"cannot repair {wheel.name}: library {library!r} could not be found on this machine; "
        f"{_needed_by(library, who_needs())}",
        fix=_FIX_MISSING.format(library=library),
    )


def _too_recent(wheel: Path) -> RocwheelsError:
    return RocwheelsError(
        f"cannot repair {wheel.name}: it uses glibc/libstdc++ symbols newer than the requested platform allows "
        "(or newer than every manylinux platform)",
        fix="build in an older builder image (a manylinux one); if the lock line or --plat sets a platform, "
        "dropping it lets auditwheel pick the tag the symbols allow",
    )


def _no_compiled_code(wheel: Path) -> RocwheelsError:
    return RocwheelsError(
        f"cannot repair {wheel.name}: it contains no compiled code",
        fix="a pure-Python wheel needs no repair; check that the build compiled the extension",
    )


def _purelib(wheel: Path) -> RocwheelsError:
    return RocwheelsError(
        f"cannot repair {wheel.name}: it puts shared libraries into purelib (Root-Is-Purelib: true)",
        fix="declare the extension to the build backend (ext_modules, or a binary distribution) so the wheel is platlib",
    )


def _failed(wheel: Path, reason: str) -> RocwheelsError:
    return RocwheelsError(
        f"auditwheel could not repair {wheel.name}: {reason}",
        fix=f"run `auditwheel repair` on {wheel.name} by hand to investigate, with the recipe's excludes",
    )


def _needed_by(library: str, files: Sequence[tuple[str, Path, Sequence[str]]]) -> str:
    """``needed by <member>``, or the chain through a library found outside the wheel."""
    direct = [name for name, _, needed in files if library in needed]
    if direct:
        return f"needed by {', '.join(direct)}"
    # Needed indirectly: ask auditwheel's own resolver which outside library pulls it in. The
    # first file with an answer is enough to act on.
    for name, path, _ in files:
        chains = [
            f"{dependency.path or soname} (pulled in by {name})"
            for soname, dependency in ldd(path).libraries.items()
            if library in dependency.needed
        ]
        if chains:
            return f"needed by {', '.join(chains)}"
    return "no file in the wheel names it directly; see the auditwheel output for the chain"
