"""The static per-line index and the constraints file, down to pip installing from them."""

from __future__ import annotations

import logging
import re
from urllib.parse import quote
from urllib.request import urlopen

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import CommandError, RocwheelsError
from pipeline.publish.index import (
    build_static_index,
    wheels_by_label,
    write_constraints,
    write_requirements,
)
from pipeline.util.files import file_sha256
from pipeline.verify.provenance import check_record, record_path, write_record

CANARY = "rocm-canary"


def test_index_has_one_tree_per_rocm_line_with_hashed_links(tmp_path, make_wheel, caplog):
    wheelhouse = tmp_path / "wheelhouse"
    canary = make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    other_line = make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.8")
    make_wheel(wheelhouse, "plain-tool", "1.0")  # no ROCm label: belongs to no line

    with caplog.at_level(logging.WARNING, logger="rocwheels"):
        roots = build_static_index(wheelhouse)

    assert roots == (wheelhouse / "simple" / "rocm9.8", wheelhouse / "simple" / "rocm9.9")
    assert (wheelhouse / "simple").is_symlink()
    line = (wheelhouse / "simple" / "rocm9.9" / "index.html").read_text()
    assert '<a href="rocm-canary/">rocm-canary</a>' in line
    assert "plain-tool" not in line
    project = (wheelhouse / "simple" / "rocm9.9" / CANARY / "index.html").read_text()
    link = f'href="../../../rocm_canary-0.1.0%2Brocm9.9-py3-none-any.whl#sha256={file_sha256(canary)}"'
    assert link in project
    assert other_line.name not in project
    assert "plain_tool-1.0-py3-none-any.whl: no +rocmX.Y local version label" in caplog.text


def test_rebuilding_swaps_in_a_complete_new_tree(tmp_path, make_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    build_static_index(wheelhouse)
    first = (wheelhouse / "simple").resolve()

    make_wheel(wheelhouse, "rocm-extra", "1.0+rocm9.9")
    build_static_index(wheelhouse)

    second = (wheelhouse / "simple").resolve()
    assert second != first and not first.exists()  # the old generation is gone, not half-updated
    assert "rocm-extra" in (wheelhouse / "simple" / "rocm9.9" / "index.html").read_text()
    assert [p.name for p in wheelhouse.iterdir() if p.name.startswith(".simple-")] == [second.name]


def test_a_real_simple_folder_is_not_overwritten(tmp_path, make_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    (wheelhouse / "simple").mkdir()
    with pytest.raises(RocwheelsError, match="is a real folder"):
        build_static_index(wheelhouse)


def test_constraints_pin_exact_versions_and_requirements_add_every_file_hash(tmp_path, make_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    canary = make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.8")

    written = write_constraints(wheelhouse)

    assert written == (wheelhouse / "constraints-rocm9.8.txt", wheelhouse / "constraints-rocm9.9.txt")
    assert (wheelhouse / "constraints-rocm9.9.txt").read_text().splitlines()[1:] == [f"{CANARY}==0.1.0+rocm9.9"]
    (requirements, _) = reversed(write_requirements(wheelhouse))
    assert requirements == wheelhouse / "requirements-rocm9.9.txt"
    lines = requirements.read_text().splitlines()
    assert lines[1:] == [f"{CANARY}==0.1.0+rocm9.9 \\", f"    --hash=sha256:{file_sha256(canary)}"]


def test_two_versions_in_one_line_cannot_be_pinned(tmp_path, make_wheel):
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    make_wheel(wheelhouse, CANARY, "0.2.0+rocm9.9")
    with pytest.raises(RocwheelsError, match=re.escape("rocm-canary has 2 versions in the rocm9.9 line")):
        write_constraints(wheelhouse)


def test_an_empty_wheelhouse_is_an_error(tmp_path):
    with pytest.raises(RocwheelsError, match=r"no wheels with a \+rocmX.Y local version label"):
        build_static_index(tmp_path)


@pytest.mark.network
def test_pip_installs_from_the_static_index_over_http(
    tmp_path, make_wheel, static_server, fresh_venv, pip_install, installed_build
):
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    build_static_index(wheelhouse)
    (tmp_path / "empty").mkdir()

    with static_server(wheelhouse) as url:
        pip_install(
            fresh_venv,
            "--index-url",
            (tmp_path / "empty").as_uri(),
            "--extra-index-url",
            f"{url}simple/rocm9.9/",
            CANARY,
        )

    assert installed_build(fresh_venv, "rocm_canary") == "0.1.0+rocm9.9 ours"


@pytest.mark.network
def test_constraints_keep_builds_from_another_index_out(
    tmp_path, make_wheel, static_server, fresh_venv, pip_install, installed_build
):
    ours = tmp_path / "wheelhouse"
    make_wheel(ours, CANARY, "0.1.0+rocm9.9")
    build_static_index(ours)
    (constraints,) = write_constraints(ours)
    elsewhere = tmp_path / "elsewhere"  # a higher version, and an impostor under our exact version
    make_wheel(elsewhere, CANARY, "0.2.0+rocm9.9", build="elsewhere")
    make_wheel(elsewhere, CANARY, "0.1.0+rocm9.9", build="elsewhere")
    build_static_index(elsewhere)

    with static_server(ours) as our_url, static_server(elsewhere) as other_url:
        indexes = ["--index-url", f"{other_url}simple/rocm9.9/", "--extra-index-url", f"{our_url}simple/rocm9.9/"]
        report = tmp_path / "unconstrained.json"
        pip_install(fresh_venv, "--dry-run", "--report", report, *indexes, CANARY)
        pip_install(fresh_venv, *indexes, "-c", constraints, CANARY)

    assert '"version": "0.2.0+rocm9.9"' in report.read_text()  # without constraints, the trap is real
    assert installed_build(fresh_venv, "rocm_canary") == "0.1.0+rocm9.9 ours"


def test_hashed_requirements_need_dependencies_installed_separately(
    tmp_path, make_wheel, fresh_venv, pip_install, installed_build
):
    """pip's hash-checking mode covers the whole install: the two-step recipe the README gives."""
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9", requires=("some-dependency",))
    (constraints,) = write_constraints(wheelhouse)
    (requirements,) = write_requirements(wheelhouse)
    make_wheel(tmp_path / "deps", "some-dependency", "1.0")  # unhashed, as PyPI's torch dependencies would be
    sources = ["--no-index", "--find-links", wheelhouse, "--find-links", tmp_path / "deps"]

    with pytest.raises(CommandError, match="--require-hashes mode"):
        pip_install(fresh_venv, *sources, "--require-hashes", "-r", requirements)
    pip_install(fresh_venv, *sources, "--require-hashes", "--no-deps", "-r", requirements)
    pip_install(fresh_venv, *sources, "-c", constraints, CANARY)  # already there: brings only the dependency

    assert installed_build(fresh_venv, "rocm_canary") == "0.1.0+rocm9.9 ours"
    assert installed_build(fresh_venv, "some_dependency") == "1.0 ours"


def test_a_package_with_its_own_label_joins_its_line(tmp_path, make_wheel):
    """vLLM names its wheels +rocm624 on the rocm6.2 line: the line's index and constraints hold it."""
    wheelhouse = tmp_path / "wheelhouse"
    make_wheel(wheelhouse, "torch", "2.5.1+rocm6.2")
    make_wheel(wheelhouse, "vllm", "0.7.3+rocm624")
    lines = wheels_by_label(wheelhouse, {"rocm624": "rocm6.2"})
    (root,) = build_static_index(wheelhouse, lines)
    assert root.name == "rocm6.2" and (root / "vllm" / "index.html").is_file()
    (constraints,) = write_constraints(wheelhouse, lines)
    assert "vllm==0.7.3+rocm624" in constraints.read_text() and constraints.name == "constraints-rocm6.2.txt"


@pytest.mark.network
def test_a_file_changed_on_the_static_index_fails_the_hash_checked_install(
    tmp_path, make_wheel, static_server, fresh_venv, pip_install
):
    """The index serves exactly the verified bytes: a file swapped on the server after `index build`
    is refused by the hashes of requirements-<line>.txt, and its provenance record, served beside
    it, no longer matches it."""
    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    write_record(wheel, "f" * 64, {"recipe": CANARY}, {"driver": "local"})
    build_static_index(wheelhouse)
    (requirements,) = write_requirements(wheelhouse)
    make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9", build="tampered")  # same name, other bytes

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with static_server(wheelhouse) as url:
        with pytest.raises(CommandError, match="DO NOT MATCH THE HASHES"):
            pip_install(
                fresh_venv, "--index-url", f"{url}simple/rocm9.9/", "--require-hashes", "--no-deps", "-r", requirements
            )
        for name in (wheel.name, record_path(wheel).name):
            with urlopen(url + quote(name), timeout=10) as served:
                (downloads / name).write_bytes(served.read())
    ok, message = check_record(downloads / wheel.name)
    assert not ok and "differs from the provenance record's" in message
    verified = CliRunner().invoke(cli, ["verify", "--no-smoke", str(downloads / wheel.name)])
    assert verified.exit_code == 1 and "differs from the provenance record's" in verified.output


@pytest.mark.network
def test_the_static_index_publishes_each_provenance_record_beside_its_wheel(tmp_path, make_wheel, static_server):
    """A teammate can fetch what made a wheel from the same place as the wheel, and check it is that file."""
    import json
    from urllib.request import urlopen

    from pipeline.verify.provenance import write_record

    wheelhouse = tmp_path / "wheelhouse"
    wheel = make_wheel(wheelhouse, CANARY, "0.1.0+rocm9.9")
    write_record(wheel, "f" * 64, {"recipe": CANARY}, {"driver": "local"})
    build_static_index(wheelhouse)

    with static_server(wheelhouse) as url:
        page = urlopen(f"{url}simple/rocm9.9/{CANARY}/").read().decode()
        (href,) = [h for h in page.split('"') if h.startswith("../../../")]
        wheel_url = url + "simple/rocm9.9/" + CANARY + "/" + href.split("#")[0]
        record = json.loads(urlopen(wheel_url + ".provenance.json").read())
    assert record["sha256"] == file_sha256(wheel) == href.split("#sha256=")[1]
