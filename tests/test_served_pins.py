"""Pin files that are served and true: `rocwheels serve` hands out each line's constraints and
requirements and each release's variants.json, made from the wheels it holds; `index build
--index-url` pins what the team index holds, not what the wheelhouse happens to have."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from urllib.error import HTTPError
from urllib.parse import unquote, urljoin
from urllib.request import urlopen

import pytest
from click.testing import CliRunner

from pipeline.cli import cli
from pipeline.errors import RocwheelsError
from pipeline.publish.index import build_static_index, page_links, write_constraints, write_requirements
from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.publish.upload import publish
from pipeline.util.files import file_sha256
from pipeline.wheel.variant import WheelVariant, make_variant, variant_label

USER, PASSWORD = "builder", "pins-password"
VERSION = "0.1.0+rocm6.2"
pytestmark = pytest.mark.network


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("TWINE_USERNAME", USER)
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    add_htpasswd_user(tmp_path / "htpasswd", USER, PASSWORD)
    with running_pypiserver(
        tmp_path / "packages", tmp_path / "htpasswd", log_file=tmp_path / "pypiserver.log"
    ) as index:
        yield index


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urlopen(url, timeout=10) as answer:
            return answer.status, answer.read()
    except HTTPError as answer:
        return answer.code, answer.read()


def _text(url: str) -> str:
    status, body = _get(url)
    assert status == 200, (url, body)
    return body.decode()


def _variants(make_wheel, folder: Path) -> list[Path]:
    """The canary's variant wheels for gfx90a and gfx942 (what `rocwheels wheels ARCH=...` publishes)."""
    made = []
    for gpu in ("gfx90a", "gfx942"):
        plain = make_wheel(folder / "plain" / gpu, "rocm-canary", VERSION, gpu)
        made.append(make_variant(plain, folder, WheelVariant(variant_label((gpu,)), (gpu,), plain=False)))
    return made


def test_serve_hands_out_pin_files_and_variants_json_made_from_what_it_holds(
    tmp_path, server, make_wheel, fresh_venv, pip_install, installed_build
):
    wheelhouse = tmp_path / "wheelhouse"
    plain = make_wheel(wheelhouse, "rocm-canary", VERSION, "plain")
    assert _get(f"{server.url}pins/constraints-rocm6.2.txt")[0] == 404  # nothing uploaded yet
    publish(wheelhouse, server.url)
    # Variant wheels reach the packages folder as any file does; the served files follow the folder.
    for variant in _variants(make_wheel, tmp_path / "variants"):
        shutil.copy(variant, tmp_path / "packages" / variant.name)
        shutil.copy(variant, wheelhouse / variant.name)

    # The very texts `index build` writes for the same wheels.
    build_static_index(wheelhouse)
    (constraints,) = write_constraints(wheelhouse)
    (requirements,) = write_requirements(wheelhouse)
    assert _text(f"{server.url}pins/constraints-rocm6.2.txt") == constraints.read_text()
    assert _text(f"{server.url}pins/requirements-rocm6.2.txt") == requirements.read_text()
    assert file_sha256(plain) in requirements.read_text()
    assert _text(f"{server.url}pins/").split() == ["constraints-rocm6.2.txt", "requirements-rocm6.2.txt"]
    status, missing = _get(f"{server.url}pins/constraints-rocm9.9.txt")
    assert status == 404 and b"constraints-rocm6.2.txt" in missing

    # PEP 825: the project page links the release's variants.json, with its sha256.
    page_url = f"{server.simple_url}rocm-canary/"
    links = page_links(_text(page_url))
    (link,) = [href for href in links if unquote(href.split("#")[0]).endswith("-variants.json")]
    status, served = _get(urljoin(page_url, link.split("#")[0]))
    assert status == 200 and link.endswith("#sha256=" + hashlib.sha256(served).hexdigest())
    assert json.loads(served) == json.loads((wheelhouse / "rocm_canary-0.1.0+rocm6.2-variants.json").read_text())
    assert sorted(json.loads(served)["variants"]) == ["gfx90a", "gfx942"]

    # A teammate's pip takes the served files by URL.
    (tmp_path / "empty").mkdir()
    indexes = ("--index-url", (tmp_path / "empty").as_uri(), "--extra-index-url", server.simple_url)
    pip_install(
        fresh_venv, *indexes, "--require-hashes", "--no-deps", "-r", f"{server.url}pins/requirements-rocm6.2.txt"
    )
    assert installed_build(fresh_venv, "rocm_canary") == f"{VERSION} plain"

    # A second build uploaded: the served pins follow at once.
    newer = make_wheel(tmp_path / "second", "rocm-canary", "0.2.0+rocm6.2", "newer")
    publish(newer.parent, server.url)
    assert "rocm-canary==0.2.0+rocm6.2" in _text(f"{server.url}pins/constraints-rocm6.2.txt")
    served_requirements = _text(f"{server.url}pins/requirements-rocm6.2.txt")
    assert file_sha256(newer) in served_requirements and file_sha256(plain) not in served_requirements
    pip_install(fresh_venv, *indexes, "-c", f"{server.url}pins/constraints-rocm6.2.txt", "rocm-canary")
    assert installed_build(fresh_venv, "rocm_canary") == "0.2.0+rocm6.2 newer"


def test_index_build_after_a_refused_publish_pins_what_the_index_holds(tmp_path, server, make_wheel):
    published = make_wheel(tmp_path / "first", "rocm-canary", VERSION, "first")
    publish(published.parent, server.url)
    wheelhouse = tmp_path / "wheelhouse"
    rebuilt = make_wheel(wheelhouse, "rocm-canary", VERSION, "second")  # same name, other bytes
    extra = make_wheel(wheelhouse, "rocm-extra", "1.0+rocm6.2")  # never reached the index
    with pytest.raises(RocwheelsError, match="already holds files under these names"):
        publish(wheelhouse, server.url)

    project = ["--wheelhouse", str(wheelhouse), "--recipes-dir", str(tmp_path / "none")]
    result = CliRunner().invoke(cli, [*project, "index", "build", "--index-url", server.simple_url])

    assert result.exit_code == 0, result.output
    requirements = (wheelhouse / "requirements-rocm6.2.txt").read_text()
    assert file_sha256(published) in requirements and file_sha256(rebuilt) not in requirements
    assert "rocm-extra" not in requirements
    warned = " ".join(result.output.split())  # the log folds long lines
    assert f"{rebuilt.name}: {server.simple_url} holds sha256 {file_sha256(published)}" in warned
    assert f"{extra.name} is in the wheelhouse but not on {server.simple_url}" in warned
