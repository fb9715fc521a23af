"""Platform tags against what a wheel's contents allow (auditwheel's policy analysis), in verify
and before repair writes one."""

from __future__ import annotations

from pathlib import Path

import pytest
from hip_wheels import EXT, PY_INCLUDE

from pipeline.cmd import run
from pipeline.errors import RocwheelsError
from pipeline.platform_tag import check_platform_tag
from pipeline.repair import repair_wheel
from pipeline.verify import Expectations, verify_wheel

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
    args = ["gcc", "-shared", "-fPIC", folder / "ext.c", "-I", PY_INCLUDE, "-o", folder / f"_ext{EXT}"]
    if too_new:
        (folder / "stub.c").write_text("int odd_fn(void) { return 1; }\n")
        (folder / "v.map").write_text("GLIBC_9.99 { global: odd_fn; local: *; };\n")
        run(["gcc", "-shared", "-fPIC", folder / "stub.c", "-o", folder / "libm.so.6", "-Wl,-soname,libm.so.6",
             f"-Wl,--version-script,{folder / 'v.map'}"])
        args += ["-DODD=odd_fn()", f"-L{folder}", "-l:libm.so.6"]
    else:
        args += ["-DODD=1"]
    run(args)
    return folder / f"_ext{EXT}"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory, platform_wheel) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tags")
    plain = _extension(root / "plain", too_new=False)
    odd = _extension(root / "odd", too_new=True)
    return {
        "plain": platform_wheel(root / "dist", "plain", {f"plain/_ext{EXT}": plain}, version="1.0+rocm6.2",
                                platform_tag="manylinux_2_17_x86_64"),
        "odd": platform_wheel(root / "dist", "odd", {f"odd/_ext{EXT}": odd}, version="1.0+rocm6.2",
                              platform_tag="manylinux_2_17_x86_64"),
        "odd-raw": platform_wheel(root / "raw", "odd", {f"odd/_ext{EXT}": odd}, version="1.0+rocm6.2"),
    }


def test_plain_extension_allows_old_and_new_manylinux(wheels):
    for tag in ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_41_x86_64"):
        allowed = check_platform_tag(wheels["plain"], tag, ())
        assert allowed is not None and allowed.problem is None, allowed


def test_symbol_outside_every_policy_allows_only_linux(wheels):
    allowed = check_platform_tag(wheels["odd"], "manylinux_2_41_x86_64", ())
    assert allowed is not None and allowed.best == "linux_x86_64"
    assert "GLIBC_9.99" in allowed.problem and "libm.so.6" in allowed.problem


def test_verify_flags_a_tag_the_contents_do_not_allow(wheels):
    errors = [f.message for f in verify_wheel(wheels["odd"], Expectations(), smoke=False).findings if f.check == "tags"]
    assert any("manylinux_2_17_x86_64" in e and "linux_x86_64" in e and "GLIBC_9.99" in e for e in errors), errors
    plain = [f.message for f in verify_wheel(wheels["plain"], Expectations(), smoke=False).findings if f.check == "tags"]
    assert plain == []


def test_repair_refuses_and_leaves_nothing(wheels, tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    # auditwheel's own automatic choice would be its newest manylinux tag.
    with pytest.raises(RocwheelsError, match="odd-1.0.*symbols newer than"):
        repair_wheel(wheels["odd-raw"], wheelhouse)
    assert list(wheelhouse.iterdir()) == []


def test_no_compiled_code_has_no_platform_to_check(tmp_path, make_wheel):
    assert check_platform_tag(make_wheel(tmp_path, "pure", "1.0"), "manylinux_2_17_x86_64", ()) is None
