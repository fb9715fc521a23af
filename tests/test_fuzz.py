"""Fuzzing, bounded: loaders and parsers fed arbitrary bytes raise only the project's own errors.

Hypothesis runs a fixed number of examples per test with no per-example deadline (the suite's
time stays bounded; a busy CI machine makes no flaky failure) and without a database on disk.
"""

from __future__ import annotations

import contextlib
import io
import struct
import subprocess
import sys
import zipfile
import zlib

import pytest
import zstandard
from elftools.elf.elffile import ELFFile
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.cli import main
from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipe
from pipeline.errors import RocwheelsError
from pipeline.wheel.archive import check_wheel
from pipeline.wheel.offload import parse_fatbin
from tests.helpers.wheels import write_platform_wheel

BOUNDED = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# TOML-ish text: keys, tables and values recipes and locks use, shuffled into nonsense.
_TOKENS = st.sampled_from(
    [
        'name = "alpha"',
        '[versions."1.0".source]',
        'path = "."',
        "url = ",
        '"x"',
        "[targets]",
        'supported = ["gfx90a"]',
        "default_line = ",
        "[lines.a]",
        "rocm = 1",
        "schema_version = 99",
        "depends_on = [",
        "]",
        "{",
        "}",
        "=",
        "\n",
        "\xff",
        "[[rules]]",
        'env = "{nope}"',
    ]
)
TOML_TEXT = st.one_of(
    st.binary(max_size=300), st.lists(_TOKENS, max_size=30).map(lambda t: " ".join(t).encode("utf-8"))
)


@BOUNDED
@given(TOML_TEXT)
def test_recipe_loader(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "alpha.toml"
    path.write_bytes(data)
    with contextlib.suppress(RocwheelsError):
        load_recipe(path)


@BOUNDED
@given(TOML_TEXT)
def test_lock_loader(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    folder = tmp_path_factory.mktemp("fuzz")
    (folder / "lock.toml").write_bytes(data)
    with contextlib.suppress(RocwheelsError):
        load_lock(folder)


def _zip_of(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


_MEMBER_NAMES = st.sampled_from(
    [
        "alpha/__init__.py",
        "alpha-1.0.dist-info/RECORD",
        "alpha-1.0.dist-info/WHEEL",
        "alpha-1.0.dist-info/METADATA",
        "../x",
        "/abs",
        "a\\b",
        "other-1.dist-info/RECORD",
    ]
)
_MEMBER_DATA = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [
            b"alpha/__init__.py,sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU,0\n",
            b"Tag: py3-none-any\n",
            b"Name: alpha\nVersion: 1.0\n",
            b"a,b\n",
            b"x,md5=1,2\n",
        ]
    ),
)
WHEEL_BYTES = st.one_of(
    st.binary(max_size=400),
    st.dictionaries(_MEMBER_NAMES, _MEMBER_DATA, max_size=6).map(_zip_of),
    st.dictionaries(_MEMBER_NAMES, _MEMBER_DATA, max_size=6)
    .map(_zip_of)
    .flatmap(lambda z: st.integers(0, max(len(z) - 1, 0)).map(lambda i: z[:i] + b"\0" + z[i + 1 :])),
)


@BOUNDED
@given(WHEEL_BYTES)
def test_wheel_checker(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "alpha-1.0-py3-none-any.whl"
    path.write_bytes(data)
    with contextlib.suppress(RocwheelsError):
        check_wheel(path)


_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
_ID = b"hipv4-amdgcn-amd-amdhsa--gfx942"
_PLAIN = _MAGIC + struct.pack("<QQQQ", 1, 56 + len(_ID), 64, len(_ID)) + _ID + bytes(range(64))


def _compressed(version: int, method: int) -> bytes:
    """A valid CCOB bundle around _PLAIN ('CCOB', version, method, [total,] size, hash, stream)."""
    stream = zlib.compress(_PLAIN) if method == 0 else zstandard.ZstdCompressor().compress(_PLAIN)
    if version == 1:
        return struct.pack("<4sHHIQ", b"CCOB", 1, method, len(_PLAIN), 0) + stream
    return struct.pack("<4sHHQQQ", b"CCOB", 3, method, 32 + len(stream), len(_PLAIN), 0) + stream


_COMPRESSED = [_compressed(version, method) for version in (1, 3) for method in (0, 1)]
# Valid compressed bundles with one byte changed or cut short, and v1 zstd headers before a zstd
# magic and noise (whose end is found by walking the frame's blocks).
_DAMAGED = st.tuples(st.sampled_from(_COMPRESSED), st.integers(0, 200), st.integers(0, 255), st.booleans()).map(
    lambda c: (
        c[0][: c[1] % len(c[0])] if c[3] else c[0][: c[1] % len(c[0])] + bytes([c[2]]) + c[0][c[1] % len(c[0]) + 1 :]
    )
)
_ZSTD_NOISE = st.binary(max_size=200).map(
    lambda b: struct.pack("<4sHHIQ", b"CCOB", 1, 1, len(_PLAIN), 0) + b"\x28\xb5\x2f\xfd" + b
)
FATBIN = st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=200).map(lambda b: _MAGIC + b),
    st.binary(max_size=200).map(lambda b: b"CCOB" + b),
    _DAMAGED,
    _ZSTD_NOISE,
)


@BOUNDED
@given(FATBIN)
def test_offload_bundle_parser(data: bytes) -> None:
    with contextlib.suppress(RocwheelsError):
        parse_fatbin(data)


# --- damaged ELF files through inspect, verify and repair ---
_ELF_EXAMPLES = settings(BOUNDED, max_examples=12)


@pytest.fixture(scope="module")
def shared_library(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small library with a dynamic section and symbol versions (puts@GLIBC_2.2.5)."""
    folder = tmp_path_factory.mktemp("elf")
    (folder / "lib.c").write_text('#include <stdio.h>\nint alpha_one(void) { return puts("one"); }\n')
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(folder / "lib.so"), str(folder / "lib.c")], check=True)
    return (folder / "lib.so").read_bytes()


def _damage(data: bytes, how: tuple[str, int, bytes]) -> bytes:
    """``data`` cut short, or ``noise`` written into one of its sections (dynamic, symbol versions, ...)."""
    kind, at, noise = how
    if kind == "truncate":
        return data[: at % len(data)]
    if kind == "header":
        start, size = 0, 64
    else:
        section = ELFFile(io.BytesIO(data)).get_section_by_name(kind)
        assert section is not None, f"gcc's library has no {kind} section"
        start, size = section["sh_offset"], section["sh_size"]
    offset = start + at % max(size, 1)
    return data[:offset] + noise + data[offset + len(noise) :]


ELF_DAMAGE = st.tuples(
    st.sampled_from(["truncate", "header", ".dynamic", ".gnu.version_r", ".gnu.version", ".dynstr", ".dynsym"]),
    st.integers(0, 1 << 16),
    st.binary(min_size=1, max_size=48),
)


@_ELF_EXAMPLES
@given(ELF_DAMAGE)
def test_damaged_elf_through_inspect_verify_and_repair(
    shared_library: bytes, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, how
) -> None:
    """Each command ends with a verdict or a RocwheelsError (exit 0 or 1), never another exception."""
    folder = tmp_path_factory.mktemp("fuzz")
    wheel = write_platform_wheel(folder, "alpha", {"alpha/libalpha.so": _damage(shared_library, how)}, version="1.0")
    for command in (["inspect"], ["verify", "--no-smoke"], ["repair", "-w", str(folder / "out")]):
        argv = ["rocwheels", "--recipes-dir", str(folder / "none"), "--work-dir", str(folder / "build"), *command]
        monkeypatch.setattr(sys, "argv", [*argv, str(wheel)])
        status: object = 0
        try:
            main()
        except SystemExit as exc:
            status = exc.code
        assert status in (0, 1), (command, how)
