"""Offload bundles: parsed from real hipcc output (plain from the host's hipcc, compressed from
Debian sid's clang 21 in its base image), and from compressed (CCOB) bundles of every format
version assembled here around a real plain bundle (older clangs cannot compress)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import zlib
from pathlib import Path

import pytest
import zstandard

from pipeline.build.engine import Engine
from pipeline.config.lock import load_lock
from pipeline.config.targets import parse_targets
from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run
from pipeline.verify.verify import ERROR, Expectations, verify_wheel
from pipeline.wheel.analyze import TargetLayout
from pipeline.wheel.offload import (
    HEADER_LIMIT,
    PLAIN_MAGIC,
    Bundle,
    BundleEntry,
    OffloadBundleError,
    gpu_targets,
    parse_fatbin,
)
from tests.helpers import REPO
from tests.helpers.hip import HIP_ENV, fatbin_of, offload_args

# The two newest Instinct processors; the lock's debian-sid line records that its clang takes them.
SID_TARGETS = ("gfx942", "gfx950")
SECOND_KERNEL = """#include <hip/hip_runtime.h>
__global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }
"""


def ccob(plain: bytes, version: int, method: str, *, zstd_window_log: int | None = None) -> bytes:
    """A compressed bundle laid out as clang writes it: 'CCOB', u16 version, u16 method,
    [v2: u32 total size | v3: u64 total size], uncompressed size (u32, v3: u64), u64 hash.
    ``zstd_window_log``: a larger window than zstd picks itself (a frame of one segment, as large
    as its content, when the content fits)."""
    method_id = {"zlib": 0, "zstd": 1}[method]
    if method == "zlib":
        stream = zlib.compress(plain)
    elif zstd_window_log:
        params = zstandard.ZstdCompressionParameters.from_level(3, window_log=zstd_window_log)
        stream = zstandard.ZstdCompressor(compression_params=params).compress(plain)
    else:
        stream = zstandard.ZstdCompressor().compress(plain)
    digest = 0x0123456789ABCDEF  # the parser does not check the hash
    if version == 1:
        return struct.pack("<4sHHIQ", b"CCOB", 1, method_id, len(plain), digest) + stream
    if version == 2:
        return struct.pack("<4sHHIIQ", b"CCOB", 2, method_id, 24 + len(stream), len(plain), digest) + stream
    return struct.pack("<4sHHQQQ", b"CCOB", 3, method_id, 32 + len(stream), len(plain), digest) + stream


def padded(data: bytes, align: int = 4096) -> bytes:
    return data + bytes(-len(data) % align)


def plain_bundle(entries: list[tuple[str, bytes]]) -> bytes:
    """A plain bundle: magic, entry count, (offset, size, id length, id) per entry, the code objects."""
    offset = len(PLAIN_MAGIC) + 8 + sum(24 + len(triple) for triple, _ in entries)
    table = []
    for triple, code in entries:
        table.append(struct.pack("<QQQ", offset, len(code), len(triple)) + triple.encode())
        offset += len(code)
    return PLAIN_MAGIC + struct.pack("<Q", len(entries)) + b"".join(table) + b"".join(code for _, code in entries)


@pytest.fixture(scope="module")
def fatbin(hip_library: Path) -> bytes:
    return fatbin_of(hip_library)


@pytest.fixture(scope="module")
def plain(fatbin: bytes) -> bytes:
    """The one plain bundle hipcc wrote, without the section's trailing padding."""
    (bundle,) = parse_fatbin(fatbin)
    return fatbin[bundle.offset : bundle.offset + bundle.size]


# --- real hipcc output -------------------------------------------------------------------------


@pytest.mark.hipcc
def test_hipcc_library_holds_one_plain_bundle_for_the_probed_targets(fatbin, hip_targets):
    (bundle,) = parse_fatbin(fatbin)
    assert (bundle.offset, bundle.compression, bundle.ccob_version) == (0, None, None)
    assert gpu_targets([bundle]) == tuple(sorted(hip_targets))
    hosts = [e for e in bundle.entries if e.processor is None]
    assert len(hosts) == 1 and hosts[0].triple_id.startswith("host-x86_64-")
    assert hosts[0].size == 0
    for entry in bundle.entries:
        if entry.processor:
            assert entry.triple_id == f"hipv4-amdgcn-amd-amdhsa--{entry.target_id}"
            assert fatbin[entry.offset : entry.offset + 4] == b"\x7fELF"


@pytest.mark.hipcc
def test_two_translation_units_give_two_bundles_with_padding(hipcc, hip_kernel, hip_targets, tmp_path):
    second = tmp_path / "second.hip"
    second.write_text(SECOND_KERNEL)
    first_obj, second_obj, library = tmp_path / "a.o", tmp_path / "b.o", tmp_path / "libtwo.so"
    run([hipcc, "-fPIC", "-c", *offload_args(hip_targets), hip_kernel, "-o", first_obj], env=HIP_ENV)
    run([hipcc, "-fPIC", "-c", *offload_args(hip_targets[:1]), second, "-o", second_obj], env=HIP_ENV)
    run([hipcc, "-shared", *offload_args(hip_targets), first_obj, second_obj, "-o", library], env=HIP_ENV)
    data = fatbin_of(library)

    first, last = parse_fatbin(data)
    assert first.offset == 0 and last.offset > first.size
    assert data[first.size : last.offset] == bytes(last.offset - first.size)
    assert gpu_targets([first]) == tuple(sorted(hip_targets))
    assert gpu_targets([last]) == hip_targets[:1]


# --- compressed bundles written by a real clang (Debian sid's clang 21, in its base image) -------


@pytest.fixture(scope="module")
def sid_compressed(
    podman_engine: Engine, sid_base: str, hip_kernel: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """Two libraries hipcc built with --offload-compress in the sid image: one translation unit
    for both targets, and two (the second for the first target only) linked together."""
    assert set(SID_TARGETS) <= set(load_lock(REPO / "recipes").line("debian-sid").targets)
    work = tmp_path_factory.mktemp("sid")
    shutil.copy2(hip_kernel, work / "kernel.hip")
    (work / "second.hip").write_text(SECOND_KERNEL)
    first, rest = " ".join(offload_args(SID_TARGETS)), " ".join(offload_args(SID_TARGETS[:1]))
    script = (
        f"hipcc -fPIC -shared --offload-compress {first} kernel.hip -o libone.so && "
        f"hipcc -fPIC -c --offload-compress {first} kernel.hip -o a.o && "
        f"hipcc -fPIC -c --offload-compress {rest} second.hip -o b.o && "
        f"hipcc -shared --offload-compress {first} a.o b.o -o libtwo.so"
    )
    compile_in(podman_engine, sid_base, work, script)
    return work / "libone.so", work / "libtwo.so"


@pytest.mark.container
def test_clang_compressed_bundles_are_read(sid_compressed) -> None:
    one, two = (parse_fatbin(fatbin_of(library)) for library in sid_compressed)
    (bundle,) = one
    assert bundle.compression in ("zlib", "zstd") and bundle.ccob_version in (1, 2, 3)
    assert gpu_targets(one) == tuple(sorted(SID_TARGETS))
    first, last = two
    assert (first.compression, last.compression) == (bundle.compression, bundle.compression)
    assert first.offset == 0 and last.offset >= first.size
    assert (gpu_targets([first]), gpu_targets([last])) == (tuple(sorted(SID_TARGETS)), SID_TARGETS[:1])
    for entry in bundle.entries:
        if entry.processor:
            assert entry.triple_id == f"hipv4-amdgcn-amd-amdhsa--{entry.target_id}"


# --- compressed bundles around the real plain bundle --------------------------------------------


@pytest.mark.hipcc
@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("method", ["zlib", "zstd"])
@pytest.mark.parametrize("align", [1, 4096], ids=["adjacent", "padded"])
def test_compressed_bundles_back_to_back(plain, hip_targets, version, method, align):
    blob = ccob(plain, version, method)
    data = padded(blob, align) + padded(blob, align)

    first, second = parse_fatbin(data)
    expected = parse_fatbin(plain)[0].entries
    assert (first.offset, first.size) == (0, len(blob))
    assert (second.offset, second.size) == (len(padded(blob, align)), len(blob))
    for bundle in (first, second):
        assert (bundle.compression, bundle.ccob_version, bundle.entries) == (method, version, expected)
    assert gpu_targets([first, second]) == tuple(sorted(hip_targets))


@pytest.mark.hipcc
def test_plain_and_compressed_bundles_mixed(plain):
    data = padded(plain) + padded(ccob(plain, 1, "zlib")) + ccob(plain, 3, "zstd") + bytes(100)
    bundles = parse_fatbin(data)
    assert [(b.compression, b.ccob_version) for b in bundles] == [(None, None), ("zlib", 1), ("zstd", 3)]
    assert len({b.entries for b in bundles}) == 1


# --- damaged input ------------------------------------------------------------------------------


@pytest.mark.hipcc
@pytest.mark.parametrize("kind", ["plain", "v1-zlib", "v1-zstd", "v2-zlib", "v3-zstd"])
def test_every_truncation_is_reported(plain, kind):
    if kind == "plain":
        data = plain
    else:
        version, method = kind.split("-")
        data = ccob(plain, int(version[1:]), method)
    for length in range(1, len(data)):
        with pytest.raises(OffloadBundleError):
            parse_fatbin(data[:length])


def _set(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    patched = bytearray(data)
    struct.pack_into(fmt, patched, offset, value)
    return bytes(patched)


def _zero_stream(blob: bytes, header_size: int) -> bytes:
    return blob[:header_size] + bytes(len(blob) - header_size)


# Offsets in a plain bundle: magic (24), count at 24, then per entry offset, size, id length.
GARBLED_PLAIN = {
    "magic": (lambda p: b"X" + p[1:], "at 0x0: expected"),
    "entry count": (lambda p: _set(p, 24, "<Q", 2**62), "entries need at least"),
    "id length": (lambda p: _set(p, 48, "<Q", 2**40), "has an id of"),
    "entry size": (lambda p: _set(p, 40, "<Q", 2**40), "past the end"),
    "id bytes": (lambda p: p[:56] + b"\xff" + p[57:], "garbled id"),
    "junk in padding": (lambda p: padded(p)[:-1] + b"\x01" + p, "found bytes 01"),
}


@pytest.mark.hipcc
@pytest.mark.parametrize("damage", GARBLED_PLAIN, ids=list(GARBLED_PLAIN))
def test_garbled_plain_bundle(plain, damage):
    garble, message = GARBLED_PLAIN[damage]
    with pytest.raises(OffloadBundleError, match=message):
        parse_fatbin(garble(plain))


GARBLED_CCOB = {
    "unknown version": (lambda p: _set(ccob(p, 3, "zstd"), 4, "<H", 9), "unknown CCOB version 9"),
    "unknown method": (lambda p: _set(ccob(p, 2, "zlib"), 6, "<H", 5), "unknown compression method 5"),
    "wrong size": (lambda p: _set(ccob(p, 1, "zlib"), 8, "<I", len(p) + 1), "header says"),
    "total past end": (lambda p: _set(ccob(p, 2, "zstd"), 8, "<I", 2**31), "total size"),
    "total in header": (lambda p: _set(ccob(p, 3, "zlib"), 8, "<Q", 3), "total size"),
    "zlib stream": (lambda p: _zero_stream(ccob(p, 3, "zlib"), 32), "garbled zlib stream"),
    "zstd stream": (lambda p: _zero_stream(ccob(p, 1, "zstd"), 20), "garbled zstd stream"),
    "not a bundle inside": (lambda p: ccob(b"not a bundle", 2, "zstd"), r"\(inflated\): expected magic"),
}


@pytest.mark.hipcc
@pytest.mark.parametrize("damage", GARBLED_CCOB, ids=list(GARBLED_CCOB))
def test_garbled_compressed_bundle(plain, damage):
    garble, message = GARBLED_CCOB[damage]
    with pytest.raises(OffloadBundleError, match=message) as caught:
        parse_fatbin(padded(plain) + garble(plain))
    assert "compressed offload bundle at 0x" in str(caught.value)
    assert isinstance(caught.value, RocwheelsError)


# --- large bundles: only the entry table is inflated --------------------------------------------


def test_an_entry_table_longer_than_the_first_read_is_read_whole():
    entries = [
        (f"hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-:{index}", bytes([index % 256]) * 100)
        for index in range(1000)
    ]
    plain = plain_bundle(entries)
    expected = parse_fatbin(plain)[0].entries
    assert len(expected) == 1000 and expected[-1].triple_id.endswith(":999")
    for version, method in ((1, "zstd"), (3, "zstd"), (1, "zlib"), (2, "zlib")):
        (bundle,) = parse_fatbin(ccob(plain, version, method))
        assert bundle.entries == expected


@pytest.mark.parametrize("method", ["zlib", "zstd"])
def test_an_entry_table_that_never_ends_is_refused(method):
    # A count of 2**40 entries over 8 MiB of zero entries: the table outgrows HEADER_LIMIT.
    plain = PLAIN_MAGIC + struct.pack("<Q", 2**40) + bytes(2 * HEADER_LIMIT)
    with pytest.raises(OffloadBundleError, match="does not end within its first"):
        parse_fatbin(ccob(plain, 3, method))


LARGE_CODE_OBJECT = 64 << 20
# In a child process: the peak RSS growth while parsing the section in argv[1], then, for zstd,
# while inflating its whole stream (from byte argv[2] on) as a streaming reader would, dropping
# the output.
_MEASURE = """
import json, re, sys, zstandard
from pipeline.wheel.offload import parse_fatbin
def peak():  # VmHWM, not ru_maxrss: that one starts from the parent's peak (Linux keeps it across exec)
    with open("/proc/self/status") as status:
        return int(re.search(r"^VmHWM:\\s+(\\d+) kB", status.read(), re.M).group(1)) << 10
with open(sys.argv[1], "rb") as stream:
    data = stream.read()
start = peak()
(bundle,) = parse_fatbin(data)
parsed = peak()
if bundle.compression == "zstd":
    with zstandard.ZstdDecompressor().stream_reader(memoryview(data)[int(sys.argv[2]):bundle.size]) as reader:
        while reader.read(1 << 20):
            pass
print(json.dumps({"parse": parsed - start, "inflate": peak() - parsed,
                  "targets": [e.processor for e in bundle.entries]}))
"""


@pytest.mark.parametrize("version, method", [(3, "zstd"), (1, "zstd"), (1, "zlib")])
def test_a_large_bundle_is_read_in_bounded_memory(tmp_path, version, method):
    # 64 MiB of code: a 16 KiB block over and over, so it compresses ~1000x (zlib too).
    code = os.urandom(16 << 10) * (LARGE_CODE_OBJECT // (16 << 10))
    plain = plain_bundle([("host-x86_64-unknown-linux-gnu", b""), ("hipv4-amdgcn-amd-amdhsa--gfx942", code)])
    blob = ccob(plain, version, method, zstd_window_log=27)
    header_size = {1: 20, 3: 32}[version]
    if method == "zstd":  # one segment: a reader of the whole stream fills a window of all 64 MiB
        assert zstandard.get_frame_parameters(blob[header_size:]).window_size >= LARGE_CODE_OBJECT
    section = tmp_path / "section"
    section.write_bytes(blob + bytes(4096))
    result = run([sys.executable, "-c", _MEASURE, section, str(header_size)], cwd=REPO, quiet=True)
    grown = json.loads(result.output.splitlines()[-1])
    assert grown["targets"] == [None, "gfx942"]
    assert grown["parse"] < 16 << 20, f"parsing grew the peak RSS by {grown['parse'] >> 20} MiB"
    if method == "zstd":  # the measure sees a full inflate's window
        assert grown["inflate"] > 48 << 20, grown


# --- ids and targets ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "triple_id, target_id, processor",
    [
        ("hipv4-amdgcn-amd-amdhsa--gfx942:sramecc+:xnack-", "gfx942:sramecc+:xnack-", "gfx942"),
        ("hipv4-amdgcn-amd-amdhsa--gfx90a", "gfx90a", "gfx90a"),
        ("hip-amdgcn-amd-amdhsa-gfx906", "gfx906", "gfx906"),  # older ids had no environment
        ("hipv4-amdgcn-amd-amdhsa--gfx9-4-generic:xnack+", "gfx9-4-generic:xnack+", "gfx9-4-generic"),
        ("host-x86_64-unknown-linux", None, None),  # hipcc 5.2
        ("host-x86_64-unknown-linux-gnu", None, None),
        ("hipv4-x86_64-unknown-linux-gnu", None, None),
    ],
)
def test_bundle_entry_ids(triple_id, target_id, processor):
    entry = BundleEntry(triple_id, 0, 0)
    assert (entry.target_id, entry.processor) == (target_id, processor)


def test_gpu_targets_are_distinct_processors_sorted():
    ids = [
        "host-x86_64-unknown-linux-gnu",
        "hipv4-amdgcn-amd-amdhsa--gfx942:xnack+",
        "hipv4-amdgcn-amd-amdhsa--gfx942:xnack-",
        "hipv4-amdgcn-amd-amdhsa--gfx90a",
    ]
    bundles = [Bundle(0, 0, None, None, tuple(BundleEntry(i, 0, 0) for i in ids))]
    assert gpu_targets(bundles) == ("gfx90a", "gfx942")


def test_empty_or_all_padding_section_has_no_bundles():
    assert parse_fatbin(b"") == ()
    assert parse_fatbin(bytes(4096)) == ()


# --- generic targets and target IDs written by a real clang (sid's clang 21) --------------------
# What ROCm 7 wheels on PyPI carry: a generic code object next to processor-specific ones, and
# target IDs with features.
GENERIC_BUILD = ("gfx11-generic", "gfx942:sramecc+", "gfx90a:xnack-")


@pytest.fixture(scope="module")
def sid_generic(
    podman_engine: Engine, sid_base: str, hip_kernel: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    work = tmp_path_factory.mktemp("sid-generic")
    shutil.copy2(hip_kernel, work / "kernel.hip")
    script = f"hipcc -fPIC -shared {' '.join(offload_args(GENERIC_BUILD))} kernel.hip -o libgeneric.so"
    compile_in(podman_engine, sid_base, work, script)
    return work / "libgeneric.so"


@pytest.mark.container
def test_generic_targets_and_target_ids_are_read_and_accepted(sid_generic, platform_wheel, tmp_path) -> None:
    bundles = parse_fatbin(fatbin_of(sid_generic))
    target_ids = {e.target_id for b in bundles for e in b.entries if e.target_id}
    assert target_ids == set(GENERIC_BUILD)
    carried = gpu_targets(bundles)
    assert carried == ("gfx11-generic", "gfx90a", "gfx942")
    # Every target a real code object carries is one ARCH accepts, with its features.
    assert tuple(str(t) for t in parse_targets(";".join(sorted(target_ids)))) == tuple(sorted(target_ids))
    # verify: the generic code object serves gfx1100 and gfx1151; gfx1200 is missing.
    wheel = platform_wheel(tmp_path, "generic_demo", {"generic_demo/libgeneric.so": sid_generic})
    layout = TargetLayout(rocm_lib_dir="/usr/lib/x86_64-linux-gnu")
    report = verify_wheel(
        wheel, Expectations(layout=layout, targets=("gfx1100", "gfx1151", "gfx942", "gfx90a")), smoke=False
    )
    assert not [f for f in report.findings if f.check == "gpu-targets"], report.findings
    report = verify_wheel(wheel, Expectations(layout=layout, targets=("gfx1200", "gfx942", "gfx90a")), smoke=False)
    (missing,) = [f for f in report.findings if f.check == "gpu-targets" and f.level == ERROR]
    assert "no code objects for gfx1200" in missing.message


def compile_in(engine: Engine, image: str, work: Path, script: str) -> None:
    """Run the bash ``script`` in ``image`` (no network, HIP_PLATFORM=amd) with ``work`` as its folder."""
    run(
        engine.command(
            "run",
            "--rm",
            "--network",
            "none",
            "--env",
            "HIP_PLATFORM=amd",
            "--volume",
            f"{work}:/work",
            "--workdir",
            "/work",
            image,
            "bash",
            "-euo",
            "pipefail",
            "-c",
            script,
        ),
        env=engine.env,
    )
