"""Platform tags against what a wheel's contents allow (auditwheel's policies over the symbol
versions the ELF files need), in verify; repair refuses such a wheel too."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import RocwheelsError
from pipeline.repair.repair import repair_wheel
from pipeline.util.cmd import run
from pipeline.verify.verify import Expectations, verify_wheel
from pipeline.wheel.analyze import analyze_wheel
from pipeline.wheel.platform_tag import check_platform_tag
from tests.helpers.hip_wheels import EXT, PY_INCLUDE

EXTENSION = """#include <Python.h>
int odd_fn(void);
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_ext", 0, -1, 0};
PyMODINIT_FUNC PyInit__ext(void) { return ODD ? PyModule_Create(&def) : 0; }
"""


def _extension(folder: Path, *, too_new: bool) -> Path:
    """An extension module; with ``too_new`` it needs a glibc symbol version no manylinux policy has
    (GLIBC_9.99 from libm.so.6: a stand-in libm built here to link against)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ext.c").write_text(EXTENSION)
    args: list[str | Path] = [
        "gcc",
        "-shared",
        "-fPIC",
        folder / "ext.c",
        "-I",
        PY_INCLUDE,
        "-o",
        folder / f"_ext{EXT}",
    ]
    if too_new:
        (folder / "stub.c").write_text("int odd_fn(void) { return 1; }\n")
        (folder / "v.map").write_text("GLIBC_9.99 { global: odd_fn; local: *; };\n")
        run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                folder / "stub.c",
                "-o",
                folder / "libm.so.6",
                "-Wl,-soname,libm.so.6",
                f"-Wl,--version-script,{folder / 'v.map'}",
            ]
        )
        args += ["-DODD=odd_fn()", f"-L{folder}", "-l:libm.so.6"]
    else:
        args += ["-DODD=1"]
    run(args)
    return folder / f"_ext{EXT}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory, platform_wheel) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tags")
    plain = _extension(root / "plain", too_new=False)
    odd = _extension(root / "odd", too_new=True)
    return {
        "plain": platform_wheel(
            root / "dist",
            "plain",
            {f"plain/_ext{EXT}": plain},
            version="1.0+rocm6.2",
            platform_tag="manylinux_2_17_x86_64",
        ),
        "odd": platform_wheel(
            root / "dist", "odd", {f"odd/_ext{EXT}": odd}, version="1.0+rocm6.2", platform_tag="manylinux_2_17_x86_64"
        ),
        "odd-raw": platform_wheel(root / "raw", "odd", {f"odd/_ext{EXT}": odd}, version="1.0+rocm6.2"),
    }


def wheel_symbol_versions(wheel: Path) -> list[tuple[str, str]]:
    return [pair for member in analyze_wheel(wheel).members for pair in member.symbol_versions]


def test_plain_extension_allows_old_and_new_manylinux(wheels):
    versions = wheel_symbol_versions(wheels["plain"])
    for tag in ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_41_x86_64"):
        assert check_platform_tag(versions, tag).problem is None


def test_symbol_outside_every_policy_allows_only_linux(wheels):
    versions = wheel_symbol_versions(wheels["odd"])
    assert ("libm.so.6", "GLIBC_9.99") in versions
    allowed = check_platform_tag(versions, "manylinux_2_41_x86_64")
    assert allowed.best == "linux_x86_64" and allowed.problem is not None
    assert "libm.so.6 GLIBC_9.99" in allowed.problem


def test_glibc_version_beyond_the_tag_and_unknown_tags():
    versions = [("libc.so.6", "GLIBC_2.34"), ("libc.so.6", "GLIBC_2.2.5")]
    assert check_platform_tag(versions, "manylinux_2_34_x86_64").problem is None
    older = check_platform_tag(versions, "manylinux_2_28_x86_64")
    assert older.best == "manylinux_2_34_x86_64" and older.problem is not None
    assert "libc.so.6 GLIBC_2.34" in older.problem and "GLIBC_2.2.5" not in older.problem
    unknown = check_platform_tag(versions, "manylinux_2_99_x86_64").problem
    assert unknown is not None and "no platform tag auditwheel knows" in unknown
    assert check_platform_tag([], "musllinux_1_2_x86_64").problem is None


def test_verify_flags_a_tag_the_contents_do_not_allow(wheels):
    errors = [f.message for f in verify_wheel(wheels["odd"], Expectations(), smoke=False).findings if f.check == "tags"]
    assert any("manylinux_2_17_x86_64" in e and "linux_x86_64" in e and "GLIBC_9.99" in e for e in errors), errors
    plain = [
        f.message for f in verify_wheel(wheels["plain"], Expectations(), smoke=False).findings if f.check == "tags"
    ]
    assert plain == []


def test_repair_refuses_and_leaves_nothing(wheels, tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    # auditwheel's own automatic choice would be its newest manylinux tag.
    with pytest.raises(RocwheelsError, match=r"odd-1.0.*symbols newer than"):
        repair_wheel(wheels["odd-raw"], wheelhouse)
    assert list(wheelhouse.iterdir()) == []
