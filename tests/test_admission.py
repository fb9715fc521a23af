"""Only verified wheels reach the index: `publish` and `index build` verify every wheel (no smoke
test), with or without a provenance record; what fails is named and left out, the rest still goes."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.request import urlopen

import pytest

from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.util.cmd import run
from pipeline.verify.provenance import record_path, write_record
from pipeline.verify.signing import new_key
from tests.helpers.signing import rocwheels, signed_project
from tests.helpers.wheels import wheel_archive, write_wheel

# The entry point binds rocwheels' log to each run's stderr (tests/helpers/signing.py).
pytestmark = pytest.mark.usefixtures("fresh_rocwheels_log")

USER, PASSWORD = "builder", "admission-password"


@pytest.fixture
def mixed_wheelhouse(tmp_path: Path) -> tuple[Path, Path]:
    """(recipes, wheelhouse): one good wheel, one with a ROCm runtime inside (no record: put there by
    hand, as `repair -w wheelhouse` would), one whose signed record was forged after signing."""
    key = new_key(tmp_path / "team.key")
    recipes = signed_project(tmp_path, [key.public])
    wheelhouse = tmp_path / "wheelhouse"
    good = write_wheel(wheelhouse, "alpha", "1.0+rocm9.9")
    write_record(good, "f" * 64, {"recipe": {"name": "alpha"}}, {"driver": "local"}, key)

    source = tmp_path / "hip.c"
    source.write_text("int hipGetDeviceCount(int *n) { *n = 0; return 0; }\n")
    runtime = tmp_path / "libamdhip64.so.6"
    run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libamdhip64.so.6", source, "-o", runtime])
    wheel_archive(
        wheelhouse / "beta-1.0+rocm9.9-py3-none-any.whl",
        "beta",
        "1.0+rocm9.9",
        "py3-none-any",
        True,
        {"beta/__init__.py": b"", "beta/libamdhip64.so.6": runtime.read_bytes()},
    )

    forged = write_wheel(wheelhouse, "gamma", "1.0+rocm9.9")
    write_record(forged, "f" * 64, {"recipe": {"name": "gamma"}}, {"driver": "local"}, key)
    fields = json.loads(record_path(forged).read_text())
    fields["fingerprint"] = "e" * 64
    record_path(forged).write_text(json.dumps(fields))
    return recipes, wheelhouse


def _check_refusals(output: str) -> None:
    assert "2 wheel(s) refused" in output and "Traceback" not in output
    assert "beta-1.0+rocm9.9-py3-none-any.whl: rocm-inside" in output
    assert "gamma-1.0+rocm9.9-py3-none-any.whl: signature" in output


@pytest.mark.network
def test_publish_uploads_the_verified_wheels_and_refuses_the_others(tmp_path, mixed_wheelhouse, capsys, monkeypatch):
    recipes, wheelhouse = mixed_wheelhouse
    add_htpasswd_user(tmp_path / "htpasswd", USER, PASSWORD)
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    packages = tmp_path / "packages"
    with running_pypiserver(packages, tmp_path / "htpasswd") as server:
        code, output = rocwheels(
            capsys,
            *("--recipes-dir", str(recipes), "--wheelhouse", str(wheelhouse)),
            *("publish", "--attempts", "1", "--repository", server.url),
        )
        assert code == 1, output
        _check_refusals(output)
        assert "1 uploaded" in output
        with urlopen(f"{server.simple_url}alpha/", timeout=10) as page:
            assert "alpha-1.0+rocm9.9-py3-none-any.whl" in page.read().decode()
    assert sorted(p.name for p in packages.glob("*.whl")) == ["alpha-1.0+rocm9.9-py3-none-any.whl"]


def test_index_build_indexes_and_pins_the_verified_wheels_only(mixed_wheelhouse, capsys):
    recipes, wheelhouse = mixed_wheelhouse
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "--wheelhouse", str(wheelhouse), "index", "build")
    assert code == 1, output
    _check_refusals(output)
    assert sorted(p.name for p in (wheelhouse / "simple" / "rocm9.9").iterdir()) == ["alpha", "index.html"]
    pins = (wheelhouse / "requirements-rocm9.9.txt").read_text()
    assert "alpha==1.0+rocm9.9" in pins and "beta" not in pins and "gamma" not in pins


def test_when_every_wheel_is_refused_nothing_is_written(mixed_wheelhouse, capsys):
    recipes, wheelhouse = mixed_wheelhouse
    (wheelhouse / "alpha-1.0+rocm9.9-py3-none-any.whl").unlink()
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "--wheelhouse", str(wheelhouse), "index", "build")
    assert code == 1 and "every wheel was refused" in output and "rocm-inside" in output
    assert not (wheelhouse / "simple").exists() and not list(wheelhouse.glob("*.txt"))
