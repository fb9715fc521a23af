"""ELF reading, on libraries and code objects built here with the local hipcc."""

from __future__ import annotations

import re
import shutil
import struct
import sys
import tracemalloc
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run
from pipeline.wheel.elf import ElfError, amdgpu_processor, is_elf, read_elf
from pipeline.wheel.offload import gpu_targets, parse_fatbin
from tests.helpers.hip import HIP_ENV, fatbin_of, offload_args

E_FLAGS_OFFSET = 48  # in an ELF64 header


@pytest.fixture(scope="module")
def hip_runtime_soname() -> str:
    """The soname of the HIP runtime the system linker knows (libamdhip64.so.N)."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    listing = run([ldconfig, "-p"]).output
    paths = re.findall(r"^\s*libamdhip64\.so\S* .*=> (\S+)$", listing, re.MULTILINE)
    assert paths, "ldconfig knows no libamdhip64.so: is the HIP runtime installed?"
    soname = read_elf(paths[0]).soname
    assert soname and re.fullmatch(r"libamdhip64\.so\.\d+", soname), soname
    return soname


@pytest.fixture(scope="module")
def hip_object(
    hipcc: str, hip_kernel: Path, hip_targets: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    obj = tmp_path_factory.mktemp("elf") / "kernel.o"
    run([hipcc, "-fPIC", "-c", *offload_args(hip_targets), hip_kernel, "-o", obj], env=HIP_ENV)
    return obj


@pytest.fixture(scope="module")
def code_objects(
    hipcc: str, hip_kernel: Path, hip_targets: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Path]:
    """A standalone AMDGPU code object per probed target (not wrapped in an offload bundle)."""
    folder = tmp_path_factory.mktemp("code-objects")
    objects = {}
    for target in hip_targets:
        objects[target] = folder / f"{target}.co"
        args: list[str | Path] = [
            hipcc,
            "--genco",
            "--no-gpu-bundle-output",
            f"--offload-arch={target}",
            hip_kernel,
            "-o",
            objects[target],
        ]
        run(args, env=HIP_ENV)
    return objects


def link(hipcc: str, hip_object: Path, hip_targets: tuple[str, ...], out: Path, *flags: str) -> Path:
    run([hipcc, "-shared", *offload_args(hip_targets), hip_object, "-o", out, *flags], env=HIP_ENV)
    return out


def patched(source: Path, out: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(source.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    out.write_bytes(data)
    return out


# --- HIP libraries ------------------------------------------------------------------------------


@pytest.mark.hipcc
def test_hip_library(hip_library, hip_targets, hip_runtime_soname):
    info = read_elf(hip_library)
    assert info.machine == read_elf(sys.executable).machine
    assert hip_runtime_soname in info.needed
    assert info.soname is None and info.rpath == () and info.runpath == ()
    assert info.amdgpu_processor is None
    assert gpu_targets(parse_fatbin(fatbin_of(hip_library))) == tuple(sorted(hip_targets))


@pytest.mark.hipcc
def test_soname_and_runpath_with_empty_entries(hipcc, hip_object, hip_targets, tmp_path):
    library = link(
        hipcc,
        hip_object,
        hip_targets,
        tmp_path / "libk.so",
        "-Wl,-soname,libk.so.3",
        "-Wl,--enable-new-dtags",
        "-Wl,-rpath,$ORIGIN/../lib::/opt/rocm/lib:",
    )
    info = read_elf(library)
    assert info.soname == "libk.so.3"
    assert info.runpath == ("$ORIGIN/../lib", "", "/opt/rocm/lib", "")
    assert info.rpath == ()


@pytest.mark.hipcc
def test_rpath(hipcc, hip_object, hip_targets, tmp_path):
    library = link(
        hipcc, hip_object, hip_targets, tmp_path / "libk.so", "-Wl,--disable-new-dtags", "-Wl,-rpath,/opt/rocm/lib"
    )
    info = read_elf(library)
    assert info.rpath == ("/opt/rocm/lib",)
    assert info.runpath == ()


def test_elf_without_gpu_code():
    info = read_elf(Path(sys.executable).resolve())
    assert info.hip_fatbin is None and info.amdgpu_processor is None
    assert info.machine.startswith("EM_")


# --- AMDGPU code objects ------------------------------------------------------------------------


@pytest.mark.hipcc
def test_standalone_code_objects_name_their_processor(code_objects):
    for target, path in code_objects.items():
        info = read_elf(path)
        assert (info.machine, info.amdgpu_processor) == ("EM_AMDGPU", target)
        assert info.hip_fatbin is None


@pytest.mark.hipcc
def test_code_objects_in_a_bundle_match_their_ids(hip_library, tmp_path):
    fatbin = fatbin_of(hip_library)
    (bundle,) = parse_fatbin(fatbin)
    gpu_entries = [e for e in bundle.entries if e.processor]
    assert gpu_entries
    for entry in gpu_entries:
        path = tmp_path / f"{entry.target_id}.co"
        path.write_bytes(fatbin[bundle.offset + entry.offset :][: entry.size])
        assert read_elf(path).amdgpu_processor == entry.processor


@pytest.mark.hipcc
@pytest.mark.parametrize(
    "mach, processor",
    [
        (0x4C, "gfx942"),
        (0x4F, "gfx950"),
        (0x41, "gfx1100"),
        (0x48, "gfx1200"),
        (0x51, "gfx9-generic"),
        (0xFE, "unknown EF_AMDGPU_MACH 0xfe"),
    ],
)
def test_processor_from_e_flags_of_a_patched_code_object(code_objects, tmp_path, mach, processor):
    source = next(iter(code_objects.values()))
    e_flags = ELFFile(source.open("rb"))["e_flags"]
    path = patched(source, tmp_path / "patched.co", E_FLAGS_OFFSET, "<I", (e_flags & ~0xFF) | mach)
    assert read_elf(path).amdgpu_processor == processor


def test_processor_ignores_feature_bits():
    assert amdgpu_processor(0x53F) == "gfx90a"  # xnack any, sramecc any, as hipcc 5.2 writes
    assert amdgpu_processor(0xB3F) == "gfx90a"  # xnack on, sramecc off
    assert amdgpu_processor(0x540) == "gfx940"


# --- what is and is not ELF ---------------------------------------------------------------------


@pytest.mark.hipcc
def test_is_elf(hip_library, tmp_path):
    (tmp_path / "text").write_text("#!/bin/sh\n")
    (tmp_path / "short").write_bytes(b"\x7fE")
    (tmp_path / "empty").write_bytes(b"")
    assert is_elf(hip_library)
    for name in ("text", "short", "empty", "missing"):
        assert not is_elf(tmp_path / name), name
    assert not is_elf(tmp_path)


def test_non_elf_names_the_file(tmp_path):
    path = tmp_path / "script.sh"
    path.write_text("#!/bin/sh\necho hello\n")
    with pytest.raises(ElfError, match=re.escape(str(path))) as caught:
        read_elf(path)
    assert isinstance(caught.value, RocwheelsError)
    with pytest.raises(ElfError, match="cannot read"):
        read_elf(tmp_path / "missing.so")


TRUNCATIONS = {
    "magic only": lambda data: data[:4],
    "ELF header only": lambda data: data[:64],
    "half": lambda data: data[: len(data) // 2],
    "last section header cut": lambda data: data[:-10],
}


@pytest.mark.hipcc
@pytest.mark.parametrize("cut", TRUNCATIONS, ids=list(TRUNCATIONS))
def test_truncated_elf_names_the_file(hip_library, tmp_path, cut):
    path = tmp_path / "truncated.so"
    path.write_bytes(TRUNCATIONS[cut](hip_library.read_bytes()))
    with pytest.raises(ElfError, match=re.escape(str(path))):
        read_elf(path)


@pytest.mark.hipcc
@pytest.mark.parametrize("field", ["sh_offset", "sh_size"])
def test_hip_fatbin_section_past_the_end_of_the_file(hip_library, tmp_path, field):
    with hip_library.open("rb") as stream:
        elf = ELFFile(stream)
        index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".hip_fatbin")
        header = elf["e_shoff"] + index * elf["e_shentsize"]
    # Section header fields of ELF64: name u32, type u32, flags u64, addr u64, offset u64, size u64.
    offset = header + (24 if field == "sh_offset" else 32)
    path = patched(hip_library, tmp_path / "garbled.so", offset, "<Q", 2**60)
    with pytest.raises(ElfError, match=r"\.hip_fatbin .*past the end of the file"):
        read_elf(path)


@pytest.mark.hipcc
def test_reads_headers_not_the_whole_file(hip_library, tmp_path):
    # A 1 GiB hole after the library stands in for a big ROCm library: reading it would show.
    big = tmp_path / "libbig.so"
    shutil.copyfile(hip_library, big)
    with big.open("r+b") as stream:
        stream.truncate(big.stat().st_size + 2**30)
    tracemalloc.start()
    try:
        info = read_elf(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info.hip_fatbin
    assert peak < 16 * 2**20, f"read_elf allocated {peak} bytes"
