"""The toolchain facts every stage shares (pipeline/config/toolchain.py)."""

import pytest

from pipeline.config.toolchain import python_tag, python_version, rocm_lib_dir


def test_rocm_lib_dir():
    assert rocm_lib_dir() == "/opt/rocm/lib"
    assert rocm_lib_dir("/opt/rocm-6.2.0/") == "/opt/rocm-6.2.0/lib"
    assert rocm_lib_dir("") == "/usr/lib"  # a distribution's ROCm


@pytest.mark.parametrize("version", ["3.9", "3.11", "3.13"])
def test_python_tag_round_trip(version):
    assert python_version(python_tag(version)) == version


@pytest.mark.parametrize("tag", ["py3", "abi3", "cp3", "cpython"])
def test_tags_naming_no_cpython_version(tag):
    assert python_version(tag) is None
