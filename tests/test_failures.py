"""Every bad input and fault in docs/failure-modes.md, run through the real command line.

Each case sets up a small project (recipes, lock, wheelhouse, cache, TMPDIR all under tmp_path),
runs ``rocwheels`` through its entry point (``pipeline.cli.main``: the one layer that turns the
project's errors into messages and exit statuses) and checks the exit status, that the message
names the cause, that no traceback is shown and that nothing half-written is left anywhere.
The catalogue in docs/failure-modes.md is checked against this table both ways.
"""

from __future__ import annotations

import io
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.cli import main
from pipeline.verify.provenance import record_path
from tests.helpers import REPO, unused_port
from tests.helpers.project import LOCK, Project, escaping_tar_source, replace_in, small_project
from tests.helpers.wheels import wheel_archive, write_platform_wheel, write_raw_zip, write_wheel

DOC = REPO / "docs" / "failure-modes.md"
CANARY = "alpha-1.0+rocm9.9-py3-none-any.whl"
# A step on a project: what it returns (a wheel's path, a port) is not used.
Setup = Callable[[Project], object]


# --- setups: each puts one mistake into a valid project ---


def recipe_text(name: str, text: str | bytes) -> Setup:
    return lambda p: p.recipe(name, text)


def url_source(url: str, sha256: str = "0" * 64) -> Setup:
    return replace_in("alpha.toml", 'path = "."', f'url = "{url}"\nsha256 = "{sha256}"')


def tampered_wheel(p: Project) -> Path:
    wheel = p.wheel()
    changed = p.root / "changed.whl"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(changed, "w") as out:
        for info in source.infolist():
            data = source.read(info)
            out.writestr(info, b"BUILD = 'tampered'\n" if info.filename == "alpha/__init__.py" else data)
    changed.replace(wheel)
    return wheel


def with_record(p: Project) -> Path:
    """A wheel with a provenance record, then changed after the record was written."""
    from pipeline.verify.provenance import write_record

    wheel = p.wheel()
    write_record(wheel, "f" * 64, {}, {"driver": "local"})
    other = write_wheel(p.root / "other", "alpha", "1.0+rocm9.9", build="swapped")
    other.replace(wheel)
    return wheel


def member_wheel(members: dict[str, bytes], *, symlink: str | None = None) -> Setup:
    """A wheel of exactly these members (plus correct metadata), one of them stored as a symlink."""

    def setup(p: Project) -> None:
        wheel = wheel_archive(p.wheelhouse / CANARY, "alpha", "1.0+rocm9.9", "py3-none-any", True, members)
        if symlink:
            rewritten = p.root / "link.whl"
            with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(rewritten, "w") as out:
                for info in source.infolist():
                    if info.filename == symlink:
                        info.external_attr = (0o120777) << 16
                    out.writestr(info, source.read(info))
            rewritten.replace(wheel)

    return setup


def raw(members: dict[str, bytes], name: str = CANARY) -> Setup:
    return lambda p: write_raw_zip(p.wheelhouse / name, members)


def recorded(
    members: dict[str, bytes],
    rows: dict[str, str] | None = None,
    *,
    version: str = "1.0+rocm9.9",
    metadata: bytes | None = None,
) -> dict[str, bytes]:
    """``members`` of alpha 1.0+rocm9.9 with WHEEL, METADATA (``version``) and a RECORD of sha256
    hashes, a member's "hash,size" replaced by ``rows``'s where given."""
    import base64
    import hashlib

    info = "alpha-1.0+rocm9.9.dist-info"
    members = {
        **members,
        f"{info}/WHEEL": b"Tag: py3-none-any\n",
        f"{info}/METADATA": metadata or f"Name: alpha\nVersion: {version}\n".encode(),
    }
    lines = []
    for name, data in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{name},{(rows or {}).get(name, f'sha256={digest},{len(data)}')}")
    return {**members, f"{info}/RECORD": ("\n".join([*lines, f"{info}/RECORD,,"]) + "\n").encode()}


def deflated(members: dict[str, bytes]) -> Setup:
    def setup(p: Project) -> None:
        p.wheelhouse.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(p.wheelhouse / CANARY, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in members.items():
                archive.writestr(name, data)

    return setup


def text_file(name: str = CANARY) -> Setup:
    def setup(p: Project) -> None:
        p.wheelhouse.mkdir(parents=True, exist_ok=True)
        (p.wheelhouse / name).write_text("not a wheel\n")

    return setup


def mounted(folder: Path, p: Project, *, size: str = "256k") -> Path:
    """A small tmpfs at ``folder`` (root only), unmounted after the test: a disk that can fill up."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a small file system needs root")
    folder.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=False).returncode:
        pytest.skip("mount is not allowed here")
    p.keep.append(_Unmount(folder))
    return folder


@dataclass(frozen=True)
class _Unmount:
    folder: Path

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.folder)], check=False)


def fill(folder: Path) -> None:
    """Fill ``folder``'s file system to the last byte (with a hidden file, so it is nobody's leftover)."""
    with (folder / ".filler").open("wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError:
            pass


def read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


def full_wheelhouse(p: Project) -> None:
    mounted(p.wheelhouse, p)
    p.wheel()
    fill(p.wheelhouse)


def read_only_wheelhouse(p: Project) -> None:
    mounted(p.wheelhouse, p)
    p.wheel()
    read_only(p.wheelhouse)


def elf_wheel(damage: Callable[[bytes], bytes] | None = None) -> Callable[[Project], Path]:
    """A platform wheel holding a small shared library built with gcc, optionally damaged by ``damage``."""

    def setup(p: Project) -> Path:
        source = p.root / "lib.c"
        # puts: a symbol version to need (GLIBC_2.2.5), so the library has a .gnu.version_r section.
        source.write_text('#include <stdio.h>\nint alpha_one(void) { return puts("one"); }\n')
        library = p.root / "libalpha.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
        data = library.read_bytes()
        return write_platform_wheel(
            p.wheelhouse, "alpha", {"alpha/libalpha.so": damage(data) if damage else data}, version="1.0+rocm9.9"
        )

    return setup


def damaged_section(name: str, offset: int, value: bytes) -> Callable[[bytes], bytes]:
    """``value`` written ``offset`` bytes into the ELF section ``name``."""

    def damage(data: bytes) -> bytes:
        from elftools.elf.elffile import ELFFile

        section = ELFFile(io.BytesIO(data)).get_section_by_name(name)
        assert section is not None, f"gcc's library has no {name} section"
        at = section["sh_offset"] + offset
        return data[:at] + value + data[at + len(value) :]

    return damage


def small_tmpdir(p: Project) -> None:
    """TMPDIR on a 64 KiB disk, and a wheel whose library (200 KB) does not fit there unpacked."""
    mounted(p.root / "small-tmp", p, size="64k")
    padded = p.root / "pad.c"
    padded.write_text("const char alpha_pad[200000] = {1};\nint alpha_one(void) { return alpha_pad[0]; }\n")
    library = p.root / "libalpha.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(library), str(padded)], check=True)
    write_platform_wheel(p.wheelhouse, "alpha", {"alpha/libalpha.so": library}, version="1.0+rocm9.9")


def read_only_cache(p: Project) -> None:
    elf_wheel()(p)
    mounted(p.root / "ro-cache", p)
    read_only(p.root / "ro-cache")


def htpasswd(text: str) -> Setup:
    return lambda p: (p.root / "htpasswd").write_text(text)


def good_htpasswd(p: Project) -> None:
    from pipeline.publish.serve import add_htpasswd_user

    add_htpasswd_user(p.root / "htpasswd", "alice", "pw")


def port_in_use(p: Project) -> None:
    good_htpasswd(p)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    p.keep.append(taken)
    (p.root / "port").write_text(str(taken.getsockname()[1]))


def indexed_then(change: Setup) -> Setup:
    """A wheelhouse with a built index and constraints, then ``change``: the old index must survive."""

    def setup(p: Project) -> None:
        from pipeline.publish.index import build_static_index, write_constraints

        p.wheel()
        build_static_index(p.wheelhouse)
        write_constraints(p.wheelhouse)
        (p.root / "before").write_text((p.wheelhouse / "constraints-rocm9.9.txt").read_text())
        change(p)

    return setup


def old_index_kept(p: Project) -> None:
    assert (p.wheelhouse / "constraints-rocm9.9.txt").read_text() == (p.root / "before").read_text()
    assert "alpha" in (p.wheelhouse / "simple" / "rocm9.9" / "index.html").read_text()


def no_file(*names: str) -> Setup:
    def check(p: Project) -> None:
        for name in names:
            assert not (p.root / name).exists(), name

    return check


def setup_all(*setups: Setup) -> Setup:
    def setup(p: Project) -> None:
        for one in setups:
            one(p)

    return setup


@dataclass(frozen=True)
class Case:
    id: str
    area: str
    args: tuple[str, ...]  # after the project options; {root} {wheel} {port} {closed} are filled in
    status: int
    says: tuple[str, ...]  # every one appears in the output
    setup: Setup | None = None
    after: Setup | None = None  # extra checks on what is left
    env: tuple[tuple[str, str], ...] = ()


PLAN = ("plan", "--arch", "gfx90a", "--rocm", "rocm9.9", "--driver", "container")
VERIFY = ("verify", "--no-smoke", "{wheel}")
INDEX = ("index", "build")
PUBLISH = ("publish", "--attempts", "1", "--repository", "http://127.0.0.1:{closed}/")
SERVE = ("serve", "--htpasswd", "{root}/htpasswd", "--packages", "{root}/packages", "--port", "{closed}")

CASES = (
    # recipes
    Case("recipe-not-toml", "recipe", PLAN, 2, ("alpha.toml", "not valid TOML"), recipe_text("alpha", "name = \n")),
    Case(
        "recipe-is-a-folder",
        "recipe",
        PLAN,
        2,
        ("gamma.toml", "is a folder"),
        lambda p: (p.recipes / "gamma.toml").mkdir(),
    ),
    Case(
        "recipe-not-utf8", "recipe", PLAN, 2, ("alpha.toml", "not UTF-8"), recipe_text("alpha", b'name = "alpha\xff"\n')
    ),
    Case(
        "recipe-unknown-key",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "colour", "unknown key"),
        replace_in("alpha.toml", 'name = "alpha"', 'name = "alpha"\ncolour = "red"'),
    ),
    Case(
        "recipe-name-missing",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "name", "required key is missing"),
        replace_in("alpha.toml", 'name = "alpha"\n', ""),
    ),
    Case(
        "recipe-name-not-file-name",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "but the file is"),
        replace_in("alpha.toml", 'name = "alpha"', 'name = "other"'),
    ),
    Case(
        "recipe-source-missing",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "exactly one of path, url, git"),
        replace_in("alpha.toml", 'path = "."', 'subdir = "x"'),
    ),
    Case(
        "recipe-url-without-scheme",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "url", "has no scheme"),
        url_source("example.org/alpha-1.0.tar.gz"),
    ),
    Case(
        "recipe-url-without-sha256",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "sha256"),
        replace_in("alpha.toml", 'path = "."', 'url = "https://example.org/a.tar.gz"'),
    ),
    Case(
        "recipe-git-short-commit",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "40-hex"),
        replace_in("alpha.toml", 'path = "."', 'git = "https://example.org/a.git"\ncommit = "abc123"'),
    ),
    Case(
        "recipe-path-missing",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "does not exist"),
        replace_in("alpha.toml", 'path = "."', 'path = "nowhere"'),
    ),
    Case(
        "recipe-subdir-escapes",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "subdir", "'../outside'", "no '..'"),
        replace_in("alpha.toml", 'path = "."', 'path = "."\nsubdir = "../outside"'),
    ),
    Case(
        "recipe-path-absolute",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "path", "'/etc'", "plain name"),
        replace_in("alpha.toml", 'path = "."', 'path = "/etc"'),
    ),
    Case(
        "recipe-not-found",
        "recipe",
        (*PLAN, "--recipes", "gamma"),
        2,
        ("unknown recipe(s): gamma", "known recipes", "alpha, beta"),
    ),
    Case(
        "recipe-unknown-dependency",
        "recipe",
        PLAN,
        2,
        ("beta.toml", "unknown recipe 'gamma'"),
        replace_in("beta.toml", '["alpha"]', '["gamma"]'),
    ),
    Case(
        "recipe-dependency-cycle",
        "recipe",
        PLAN,
        2,
        ("dependency cycle",),
        replace_in("alpha.toml", "depends_on = []", 'depends_on = ["beta"]'),
    ),
    Case(
        "recipe-same-distribution",
        "recipe",
        PLAN,
        2,
        ("distribution", "one recipe per distribution"),
        replace_in("beta.toml", 'name = "beta"', 'name = "beta"\ndistribution = "alpha"'),
    ),
    Case(
        "recipe-unknown-placeholder",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "unknown placeholder {nope}"),
        replace_in("alpha.toml", "[targets]", '[env]\nX = "{nope}"\n[targets]'),
    ),
    Case(
        "recipe-bad-version", "recipe", PLAN, 2, ("alpha.toml", "versions"), replace_in("alpha.toml", '"1.0"', '"one"')
    ),
    Case(
        "recipe-unknown-gpu-target",
        "recipe",
        PLAN,
        2,
        ("alpha.toml", "gfx9999"),
        replace_in("alpha.toml", '"gfx90a", "gfx942"', '"gfx9999"'),
    ),
    # the lock
    Case(
        "lock-missing", "lock", PLAN, 2, ("lock.toml", "file not found"), lambda p: (p.recipes / "lock.toml").unlink()
    ),
    Case("lock-not-toml", "lock", PLAN, 2, ("lock.toml", "not valid TOML"), recipe_text("lock", "[lines\n")),
    Case(
        "lock-schema-too-new",
        "lock",
        PLAN,
        2,
        ("lock.toml", "schema_version", "upgrade rocwheels"),
        replace_in("lock.toml", "default_line", "schema_version = 99\ndefault_line"),
    ),
    Case(
        "lock-default-line-unknown",
        "lock",
        PLAN,
        2,
        ("default_line", "is not a line"),
        replace_in("lock.toml", 'default_line = "rocm9.9"', 'default_line = "rocm1.0"'),
    ),
    Case(
        "lock-unknown-line",
        "lock",
        ("plan", "--arch", "gfx90a", "--rocm", "rocm1.0"),
        2,
        ("no ROCm line named 'rocm1.0'", "rocm9.9"),
    ),
    Case(
        "lock-pin-without-recipe",
        "lock",
        ("lock", "check"),
        2,
        ("lines.rocm9.9.versions.gamma", "no recipe of that name"),
        replace_in("lock.toml", 'beta = "1.0"', 'beta = "1.0"\ngamma = "1.0"'),
    ),
    Case(
        "lock-line-name-escapes",
        "lock",
        ("lock", "check"),
        2,
        ("lock.toml", "lines", "'../evil'", "plain name"),
        lambda p: (p.recipes / "lock.toml").write_text(LOCK + LOCK.split("\n", 1)[1].replace('"rocm9.9"', '"../evil"')),
        no_file("evil.txt"),
    ),
    Case(
        "lock-pins-unknown-version",
        "lock",
        ("lock", "check"),
        2,
        ("alpha", "2.0"),
        replace_in("lock.toml", 'alpha = "1.0"', 'alpha = "2.0"'),
    ),
    Case(
        "lock-dependency-unpinned",
        "lock",
        ("lock", "check"),
        2,
        ("beta depends on alpha",),
        replace_in("lock.toml", 'alpha = "1.0"\n', ""),
    ),
    Case(
        "lock-unknown-key",
        "lock",
        PLAN,
        2,
        ("lock.toml", "unknown key"),
        replace_in("lock.toml", 'rocm = "9.9.0"', 'rocm = "9.9.0"\nflavour = "x"'),
    ),
    Case(
        "index-build-pin-without-recipe",
        "index",
        INDEX,
        2,
        ("no recipe of that name",),
        setup_all(lambda p: p.wheel(), replace_in("lock.toml", 'beta = "1.0"', 'beta = "1.0"\ngamma = "1.0"')),
    ),
    # ARCH
    Case(
        "arch-unknown-target",
        "arch",
        ("plan", "--arch", "gfx9999", "--rocm", "rocm9.9"),
        2,
        ("unknown GPU target 'gfx9999'", "gfx942"),
    ),
    Case(
        "arch-contradictory-features",
        "arch",
        ("plan", "--arch", "gfx90a:xnack+:xnack-", "--rocm", "rocm9.9"),
        2,
        ("gfx90a:xnack+:xnack-", "sets xnack more than once"),
    ),
    Case("arch-empty", "arch", ("plan", "--arch", "", "--rocm", "rocm9.9"), 2, ("no GPU target given", "ARCH=gfx942")),
    Case("arch-only-separators", "arch", ("plan", "--arch", ";,", "--rocm", "rocm9.9"), 2, ("no GPU target given",)),
    Case("arch-missing", "arch", ("plan", "--rocm", "rocm9.9"), 2, ("Missing option '--arch'",)),
    Case(
        "verify-arch-empty",
        "arch",
        ("verify", "--no-smoke", "--arch", "", "{wheel}"),
        2,
        ("no GPU target given",),
        lambda p: p.wheel(),
    ),
    Case(
        "verify-arch-unknown",
        "arch",
        ("verify", "--no-smoke", "--arch", "sm_90", "{wheel}"),
        2,
        ("unknown GPU target 'sm_90'",),
        lambda p: p.wheel(),
    ),
    # wheels given to verify, inspect, repair
    Case("wheel-missing", "wheel", VERIFY, 1, ("no such wheel",)),
    Case("wheel-none-given", "wheel", ("verify",), 2, ("give one or more wheel files",)),
    Case("wheel-not-a-zip", "wheel", VERIFY, 1, ("not a readable zip archive", "rebuild"), text_file()),
    Case(
        "wheel-bad-file-name",
        "wheel",
        ("verify", "--no-smoke", "{wheelhouse}/alpha.whl"),
        1,
        ("not a wheel file name",),
        text_file("alpha.whl"),
    ),
    Case(
        "wheel-tampered-member-verify",
        "wheel",
        VERIFY,
        1,
        ("member alpha/__init__.py does not match its RECORD hash", "rebuild"),
        tampered_wheel,
    ),
    Case(
        "wheel-tampered-member-inspect",
        "wheel",
        ("inspect", "{wheel}"),
        1,
        ("member alpha/__init__.py does not match its RECORD hash",),
        tampered_wheel,
    ),
    Case(
        "wheel-tampered-member-repair",
        "wheel",
        ("repair", "-w", "{root}/repaired", "{wheel}"),
        1,
        ("member alpha/__init__.py does not match its RECORD hash",),
        tampered_wheel,
        no_file("repaired/" + CANARY),
    ),
    Case(
        "wheel-symlink-member",
        "wheel",
        VERIFY,
        1,
        ("alpha/link.py is a symbolic link",),
        member_wheel({"alpha/__init__.py": b"", "alpha/link.py": b"__init__.py"}, symlink="alpha/link.py"),
    ),
    Case(
        "wheel-unsafe-member-path",
        "wheel",
        VERIFY,
        1,
        ("unsafe member path '../evil.py'",),
        raw({"../evil.py": b"", "alpha-1.0+rocm9.9.dist-info/RECORD": b""}),
    ),
    Case(
        "wheel-record-names-missing-file",
        "wheel",
        VERIFY,
        1,
        ("RECORD lists files the archive does not contain",),
        raw(
            {
                "alpha-1.0+rocm9.9.dist-info/WHEEL": b"Tag: py3-none-any\n",
                "alpha-1.0+rocm9.9.dist-info/METADATA": b"Name: alpha\nVersion: 1.0+rocm9.9\n",
                "alpha-1.0+rocm9.9.dist-info/RECORD": b"alpha/gone.py,,\n",
            }
        ),
    ),
    Case(
        "wheel-file-missing-from-record",
        "wheel",
        VERIFY,
        1,
        ("files missing from RECORD", "alpha/extra.py"),
        raw(
            {
                "alpha/extra.py": b"",
                "alpha-1.0+rocm9.9.dist-info/WHEEL": b"Tag: py3-none-any\n",
                "alpha-1.0+rocm9.9.dist-info/METADATA": b"Name: alpha\nVersion: 1.0+rocm9.9\n",
                "alpha-1.0+rocm9.9.dist-info/RECORD": b"",
            }
        ),
    ),
    Case(
        "wheel-two-dist-info",
        "wheel",
        VERIFY,
        1,
        ("exactly one top-level .dist-info folder",),
        raw({"a-1.dist-info/RECORD": b"", "alpha-1.0+rocm9.9.dist-info/RECORD": b""}),
    ),
    Case(
        "wheel-weak-record-hash",
        "wheel",
        VERIFY,
        1,
        ("RECORD hash for alpha/__init__.py uses 'md5'",),
        raw(recorded({"alpha/__init__.py": b""}, {"alpha/__init__.py": "md5=x,0"})),
    ),
    Case(
        "wheel-empty-record-hash",
        "wheel",
        VERIFY,
        1,
        ("RECORD has no hash for alpha/__init__.py",),
        raw(recorded({"alpha/__init__.py": b"BUILD = 'changed'\n"}, {"alpha/__init__.py": ","})),
    ),
    Case(
        "wheel-metadata-version-differs",
        "wheel",
        VERIFY,
        1,
        ("METADATA says alpha 2.0", "1.0+rocm9.9"),
        raw(recorded({"alpha/__init__.py": b""}, version="2.0")),
    ),
    Case(
        "wheel-names-differ-in-case",
        "wheel",
        VERIFY,
        1,
        ("alpha/Mod.py and alpha/mod.py differ only in case",),
        raw(recorded({"alpha/mod.py": b"", "alpha/Mod.py": b""})),
    ),
    Case(
        "wheel-file-is-also-a-folder",
        "wheel",
        VERIFY,
        1,
        ("alpha/data is both a file and the folder of other members",),
        raw(recorded({"alpha/data": b"", "alpha/data/x.py": b""})),
    ),
    Case(
        "wheel-member-name-too-long",
        "wheel",
        VERIFY,
        1,
        ("has a name longer than file systems allow",),
        raw(recorded({"alpha/" + "x" * 300 + ".py": b""})),
    ),
    Case(
        "wheel-zip-bomb",
        "wheel",
        VERIFY,
        1,
        ("alpha/zeros.bin inflates", "zip bomb", "ROCWHEELS_MAX_RATIO"),
        deflated(recorded({"alpha/zeros.bin": bytes(8 << 20)})),
    ),
    Case(
        "wheel-past-size-bound",
        "wheel",
        VERIFY,
        1,
        ("more than the bound of 1048576", "ROCWHEELS_MAX_UNPACKED"),
        raw(recorded({"alpha/data.bin": os.urandom(2 << 20)})),
        None,
        (("ROCWHEELS_MAX_UNPACKED", "1M"),),
    ),
    Case(
        "wheel-size-bound-not-a-number",
        "wheel",
        VERIFY,
        2,
        ("ROCWHEELS_MAX_UNPACKED='lots'",),
        lambda p: p.wheel(),
        None,
        (("ROCWHEELS_MAX_UNPACKED", "lots"),),
    ),
    Case(
        "wheel-metadata-name-missing",
        "wheel",
        VERIFY,
        1,
        ("METADATA Name missing",),
        raw(recorded({}, metadata=b"Version: 1.0\n")),
    ),
    Case("wheel-changed-after-verify", "wheel", VERIFY, 1, ("differs from the provenance record",), with_record),
    Case(
        "wheel-broken-provenance-record",
        "wheel",
        VERIFY,
        1,
        ("not a readable provenance record",),
        setup_all(lambda p: p.wheel(), lambda p: record_path(p.wheelhouse / CANARY).write_text("{")),
    ),
    # A fresh clone has no build/ yet: the smoke test's venv still gets a place (it used to crash).
    Case(
        "verify-fresh-clone-without-work-dir",
        "wheel",
        ("--work-dir", "{root}/absent/build", "verify", "{wheel}"),
        0,
        ("smoke", "alpha imported"),
        lambda p: p.wheel(),
    ),
    Case(
        "repair-wheel-missing",
        "wheel",
        ("repair", "-w", "{root}/out", "{root}/alpha-1.0-py3-none-any.whl"),
        1,
        ("no such wheel",),
    ),
    Case(
        "elf-version-section-damaged-verify",
        "wheel",
        ("verify", "--no-smoke", "{elf_wheel}"),
        1,
        ("libalpha.so", ".gnu.version_r"),
        elf_wheel(damaged_section(".gnu.version_r", 0, b"\xff" * 16)),
    ),
    Case(
        "elf-version-section-damaged-repair",
        "wheel",
        ("repair", "-w", "{root}/out", "{elf_wheel}"),
        1,
        ("libalpha.so", ".gnu.version_r"),
        elf_wheel(damaged_section(".gnu.version_r", 0, b"\xff" * 16)),
        no_file("out/alpha-1.0+rocm9.9"),
    ),
    Case(
        "elf-version-section-damaged-inspect",
        "wheel",
        ("inspect", "{elf_wheel}"),
        1,
        ("libalpha.so", ".gnu.version_r"),
        elf_wheel(damaged_section(".gnu.version_r", 0, b"\xff" * 16)),
    ),
    Case(
        "elf-dynamic-section-garbage",
        "wheel",
        ("verify", "--no-smoke", "{elf_wheel}"),
        1,
        ("libalpha.so", "dynamic section"),
        elf_wheel(damaged_section(".dynamic", 0, bytes(range(7, 247)) * 2)),
    ),
    # full, read-only and unusable places
    Case(
        "wheelhouse-read-only",
        "disk",
        INDEX,
        1,
        ("cannot write", "wheelhouse", "read-only file system"),
        read_only_wheelhouse,
    ),
    Case("wheelhouse-full", "disk", INDEX, 1, ("cannot write", "wheelhouse", "no space left"), full_wheelhouse),
    Case(
        "repair-output-read-only",
        "disk",
        ("repair", "-w", "{root}/ro-out", "{elf_wheel}"),
        1,
        ("cannot write", "ro-out", "read-only file system"),
        setup_all(elf_wheel(), lambda p: read_only(mounted(p.root / "ro-out", p))),
    ),
    Case(
        "repair-tmpdir-full",
        "disk",
        ("repair", "-w", "{root}/out", "{elf_wheel}"),
        1,
        ("cannot write", "small-tmp", "no space left"),
        small_tmpdir,
        no_file("out/alpha-1.0+rocm9.9"),
        (("TMPDIR", "{root}/small-tmp"),),
    ),
    Case(
        "cache-is-a-file",
        "disk",
        ("repair", "-w", "{root}/out", "{elf_wheel}"),
        2,
        ("cache", "is a file", "ROCWHEELS_CACHE"),
        elf_wheel(),
        None,
        (("ROCWHEELS_CACHE", "{root}/recipes/lock.toml"),),
    ),
    Case(
        "cache-read-only",
        "disk",
        ("repair", "-w", "{root}/out", "{elf_wheel}"),
        0,
        ("cannot keep a note of this repair in the cache", "ROCWHEELS_CACHE"),
        read_only_cache,
        None,
        (("ROCWHEELS_CACHE", "{root}/ro-cache"),),
    ),
    Case(
        "source-tar-escaping-link",
        "recipe",
        ("build", "--driver", "local", "--arch", "gfx90a", "--recipes", "alpha"),
        1,
        ("alpha-1.0.tar.gz", "unsafe member", "escape"),
        escaping_tar_source,
    ),
    # the index
    Case("index-no-wheelhouse", "index", INDEX, 2, ("no wheelhouse at",)),
    Case(
        "index-no-labelled-wheels",
        "index",
        INDEX,
        1,
        ("every wheel was refused", "has no +rocm local label"),
        lambda p: p.wheel("1.0"),
    ),
    Case(
        "index-text-file-named-whl",
        "index",
        INDEX,
        1,
        ("not a readable zip archive",),
        indexed_then(text_file("beta-1.0+rocm9.9-py3-none-any.whl")),
        old_index_kept,
    ),
    Case(
        "index-bad-wheel-name",
        "index",
        INDEX,
        1,
        ("not a valid wheel file name",),
        indexed_then(text_file("beta.whl")),
        old_index_kept,
    ),
    Case(
        "index-two-versions-one-line",
        "index",
        INDEX,
        1,
        ("2 versions in the rocm9.9 line", "can pin only one"),
        indexed_then(lambda p: p.wheel("1.1+rocm9.9")),
        old_index_kept,
    ),
    Case("index-wheel-changed-after-verify", "index", INDEX, 1, ("is not the one verify accepted",), with_record),
    Case(
        "index-simple-is-a-real-folder",
        "index",
        INDEX,
        1,
        ("is a real folder",),
        setup_all(lambda p: p.wheel(), lambda p: (p.wheelhouse / "simple").mkdir()),
    ),
    # publishing
    Case("publish-empty-wheelhouse", "publish", PUBLISH, 1, ("no wheels to publish",), lambda p: p.wheelhouse.mkdir()),
    Case(
        "publish-index-unreachable",
        "publish",
        PUBLISH,
        1,
        ("unreachable", "gave up after 1 attempts", "rocwheels serve"),
        lambda p: p.wheel(),
    ),
    Case(
        "publish-unknown-pypirc-section",
        "publish",
        ("publish", "--repository", "nowhere", "--config-file", "{root}/pypirc"),
        1,
        ("cannot use repository 'nowhere'",),
        setup_all(
            lambda p: p.wheel(), lambda p: (p.root / "pypirc").write_text("[distutils]\nindex-servers = other\n")
        ),
    ),
    Case("publish-text-file-named-whl", "publish", PUBLISH, 1, ("not a readable zip archive",), text_file()),
    Case("publish-wheel-changed-after-verify", "publish", PUBLISH, 1, ("is not the one verify accepted",), with_record),
    Case(
        "publish-attempts-zero",
        "publish",
        ("publish", "--attempts", "0", "--repository", "http://127.0.0.1:1/"),
        2,
        ("--attempts",),
    ),
    Case("publish-repository-missing", "publish", ("publish",), 2, ("Missing option '--repository'",)),
    # the served index
    Case("serve-no-htpasswd", "serve", SERVE, 2, ("no htpasswd file", "index add-user")),
    Case("serve-htpasswd-without-users", "serve", SERVE, 2, ("holds no user", "index add-user"), htpasswd("")),
    Case(
        "serve-htpasswd-garbage", "serve", SERVE, 2, ("is not a readable htpasswd file",), htpasswd("no colon here\n")
    ),
    Case(
        "serve-host-unresolvable",
        "serve",
        (*SERVE, "--host", "no-such-host.invalid"),
        2,
        ("does not resolve",),
        good_htpasswd,
    ),
    Case(
        "serve-port-in-use",
        "serve",
        ("serve", "--htpasswd", "{root}/htpasswd", "--packages", "{root}/packages", "--port", "{port}"),
        1,
        ("already in use", "another --port"),
        port_in_use,
    ),
    Case("serve-port-out-of-range", "serve", ("serve", "--port", "70000"), 2, ("70000",)),
    Case(
        "serve-packages-is-a-file",
        "serve",
        ("serve", "--htpasswd", "{root}/htpasswd", "--packages", "{root}/htpasswd", "--port", "{closed}"),
        2,
        ("is a file",),
        good_htpasswd,
    ),
    Case(
        "add-user-colon-in-name",
        "serve",
        ("index", "add-user", "al:ice", "--htpasswd", "{root}/htpasswd"),
        2,
        ("cannot be stored in an htpasswd file",),
        None,
        no_file("htpasswd"),
        (("ROCWHEELS_INDEX_PASSWORD", "pw"),),
    ),
    Case(
        "add-user-empty-name",
        "serve",
        ("index", "add-user", "", "--htpasswd", "{root}/htpasswd"),
        2,
        ("cannot be stored",),
        None,
        no_file("htpasswd"),
        (("ROCWHEELS_INDEX_PASSWORD", "pw"),),
    ),
    Case(
        "add-user-broken-htpasswd",
        "serve",
        ("index", "add-user", "bob", "--htpasswd", "{root}/htpasswd"),
        2,
        ("is not a readable htpasswd file",),
        htpasswd("no colon here\n"),
        None,
        (("ROCWHEELS_INDEX_PASSWORD", "pw"),),
    ),
    # tools missing on this machine
    Case(
        "no-container-engine",
        "tools",
        ("image", "build", "--rocm", "rocm9.9"),
        1,
        ("no working container engine",),
        None,
        None,
        (("PATH", "{root}/empty-bin"),),
    ),
    Case("doctor-unknown-line", "tools", ("doctor", "--rocm", "rocm1.0"), 2, ("no ROCm line named 'rocm1.0'",)),
    Case("unknown-command", "tools", ("bulid",), 2, ("No such command 'bulid'",)),
)


def _fill(value: str, project: Project, closed: int) -> str:
    port = (project.root / "port").read_text() if (project.root / "port").exists() else ""
    elf = next(iter(sorted(project.wheelhouse.glob("*-linux_*.whl"))), "") if project.wheelhouse.is_dir() else ""
    return value.format(
        root=project.root,
        wheel=project.wheelhouse / CANARY,
        elf_wheel=elf,
        wheelhouse=project.wheelhouse,
        port=port,
        closed=closed,
    )


def run_rocwheels(project: Project, args: tuple[str, ...], capsys, monkeypatch, env=()) -> tuple[int, str]:
    """``rocwheels --recipes-dir ... ARGS`` through its real entry point; (exit status, stdout + stderr)."""
    closed = unused_port()
    (project.root / "empty-bin").mkdir(exist_ok=True)
    for name, value in env:
        monkeypatch.setenv(name, _fill(value, project, closed))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again (a case may move it)
    argv = [
        "rocwheels",
        "--recipes-dir",
        str(project.recipes),
        "--wheelhouse",
        str(project.wheelhouse),
        "--work-dir",
        str(project.work),
        *(_fill(a, project, closed) for a in args),
    ]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        main()
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def leftovers(project: Project) -> list[str]:
    """Half-written files anywhere in the project, and anything in its TMPDIR."""
    partial = [
        str(p.relative_to(project.root))
        for p in project.root.rglob("*")
        if p.name.endswith((".partial", ".tmp")) or (p.name.startswith(".simple-") and p.name.endswith(".link"))
    ]
    return partial + [p.name for p in project.tmp.iterdir()]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    project = small_project(tmp_path)
    monkeypatch.setenv("TMPDIR", str(project.tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    monkeypatch.setenv("ROCWHEELS_CACHE", str(project.cache))
    for name in (
        "ROCWHEELS_ARCH",
        "ROCWHEELS_ROCM",
        "ROCWHEELS_DRIVER",
        "ROCWHEELS_REPOSITORY",
        "TWINE_USERNAME",
        "TWINE_PASSWORD",
    ):
        monkeypatch.delenv(name, raising=False)
    # Setups may log (index builds) before main sets logging up: not to a closed earlier capture.
    monkeypatch.setattr(logging.getLogger("rocwheels"), "handlers", [])
    yield project
    for kept in project.keep:
        kept.close()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_failure(case: Case, project: Project, capsys, monkeypatch) -> None:
    if case.setup:
        case.setup(project)
    status, output = run_rocwheels(project, case.args, capsys, monkeypatch, case.env)
    assert status == case.status, output
    for phrase in case.says:
        assert phrase in output, (phrase, output)
    assert "Traceback" not in output
    if case.status and "Usage:" not in output:  # the project's own errors, not click's usage errors
        assert "fix:" in output, output
    if case.status:
        assert "error" in output.lower()  # "error: <cause>\n  fix: ..." or click's "Error: ..." for usage
    assert leftovers(project) == []
    if case.after:
        case.after(project)


_ROW = re.compile(r"^\|(?P<cells>.+)\|\s*$")
_TEST_REF = re.compile(r"`tests/(?P<module>test_\w+)\.py::(?P<test>\w+)(?:\[(?P<param>[\w-]+)\])?`")


def _doc_rows() -> list[tuple[str, str, str]]:
    """(area, exit status, test reference) of every catalogue row, as the table spells them."""
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = _ROW.match(line)
        if not match or "---" in line:
            continue
        cells = [c.strip() for c in match["cells"].split("|")]
        if cells[0] in ("area", ""):
            continue
        rows.append((cells[0], cells[3], cells[4]))
    return rows


def test_catalogue_and_table_agree() -> None:
    rows = _doc_rows()
    assert len(rows) >= 60
    named = {}
    for _area, status, reference in rows:
        ref = _TEST_REF.search(reference)
        assert ref, f"row names no test: {reference}"
        module = (REPO / "tests" / f"{ref['module']}.py").read_text()
        assert f"def {ref['test']}(" in module, reference
        if ref["module"] == "test_failures":
            named[ref["param"]] = status
        elif ref["param"]:  # parametrize ids joined by "-": each must be one the module defines
            assert all(f'"{part}"' in module for part in ref["param"].split("-")), reference
    cases = {c.id: str(c.status) for c in CASES}
    assert named == cases, "docs/failure-modes.md and CASES differ (id or exit status)"
