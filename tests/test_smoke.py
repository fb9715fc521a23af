"""The smoke test's install: uv installs what pip would with this machine's pip settings, and pip
keeps the last word (its verdict, its error) wherever uv cannot stand in for it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.config.recipes import Smoke
from pipeline.verify import pip_config
from pipeline.verify.pip_config import pip_settings, uv_for_pip_settings
from pipeline.verify.smoke import SmokeResult, smoke_test
from tests.helpers.fake_gpu import fake_gpus
from tests.helpers.torch_line import simple_index
from tests.helpers.wheels import write_wheel


@pytest.fixture
def pip_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No PIP_* or UV_* variable and no pip configuration file of this machine: a test sets its own."""
    for name in list(os.environ):
        if name.startswith(("PIP_", "UV_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    return monkeypatch


def _without_uv(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pip_config, "uv_binary", lambda: None)


# --- pip's settings, read as pip reads them ---


def test_pip_settings_come_from_its_files_in_order_then_its_variables(tmp_path: Path) -> None:
    (tmp_path / "xdg" / "pip").mkdir(parents=True)
    (tmp_path / "xdg" / "pip" / "pip.conf").write_text(
        "[global]\nfind-links = /global\nindex_url = https://global.example/simple\n"
    )
    (tmp_path / "home" / ".config" / "pip").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "pip" / "pip.conf").write_text(
        "[global]\nfind-links = /user\n[install]\nextra-index-url =\n  https://a.example/simple\n"
        "  https://b.example/simple\n[download]\nno-index = yes\n"
    )
    environ = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_DIRS": str(tmp_path / "xdg"), "PIP_INDEX_URL": ""}
    settings = pip_settings({**environ, "PIP_PRE": "1"})
    # The user's file overrides the global one, [install] adds to [global], other commands' sections
    # count for nothing, and an empty variable leaves the file's value.
    assert settings["find-links"] == "/user"
    assert settings["index-url"] == "https://global.example/simple"
    assert settings["extra-index-url"].split() == ["https://a.example/simple", "https://b.example/simple"]
    assert settings["pre"] == "1" and "no-index" not in settings
    # PIP_CONFIG_FILE: its file last, the user's not at all; os.devnull: no file at all.
    (tmp_path / "mine.conf").write_text("[install]\nno-index = true\n")
    mine = pip_settings({**environ, "PIP_CONFIG_FILE": str(tmp_path / "mine.conf")})
    assert mine["find-links"] == "/global" and mine["no-index"] == "true"
    assert pip_settings({"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "/env"}) == {
        "config-file": os.devnull,
        "find-links": "/env",
    }


def test_pip_settings_become_uv_options_and_uv_reads_nothing_of_its_own() -> None:
    settings = {
        "index-url": "https://i.example/simple",
        "extra-index-url": "https://a.example/simple https://b.example/simple",
        "find-links": "/wheels",
        "constraint": "/c.txt",
        "no-index": "off",
        "cert": "/ca.pem",
        "disable-pip-version-check": "1",
    }
    uv = uv_for_pip_settings(settings, {"UV_INDEX_URL": "https://elsewhere.example", "HOME": "/root"})
    assert not isinstance(uv, str), uv
    assert uv.options == (
        *("--index-strategy", "unsafe-best-match"),
        *("--index-url", "https://i.example/simple"),
        *("--extra-index-url", "https://a.example/simple", "--extra-index-url", "https://b.example/simple"),
        *("--find-links", "/wheels", "--constraint", "/c.txt"),
    )
    assert uv.env == {"UV_INDEX_URL": None, "SSL_CERT_FILE": "/ca.pem"}


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"prefer-binary": "1"}, "pip setting prefer-binary has no uv equivalent here"),
        ({"no-index": "maybe"}, "pip setting no-index=maybe is not a yes or no"),
    ],
)
def test_a_pip_setting_uv_cannot_follow_leaves_the_install_to_pip(settings: dict[str, str], why: str) -> None:
    assert uv_for_pip_settings(settings, {}) == why


# --- installs: uv and pip give the same venv, pip's error on a failure ---


def _installed(tmp_path: Path, name: str) -> str:
    """A check run in the smoke venv: writes what is installed there to ``tmp_path/name``, and fails
    if anything of rocwheels' own venv (click) is visible."""
    return (
        "import importlib.metadata as m, importlib.util, json, sys; "
        "assert importlib.util.find_spec('click') is None, 'rocwheels venv visible'; "
        f"open({str(tmp_path / name)!r}, 'w').write(json.dumps(sorted("
        "(d.metadata['Name'], d.version, __import__(d.metadata['Name']).BUILD) for d in m.distributions())))"
    )


@pytest.mark.slow
def test_uv_and_pip_install_the_same_builds_from_the_wheelhouse_and_the_indexes(
    tmp_path: Path, pip_env: pytest.MonkeyPatch, static_server
) -> None:
    """beta pinned to the wheelhouse's build, gamma wherever its best version is: pip takes the best
    version of every index (2.0 from the main index, not 1.0 from the extra one uv would ask first)."""
    wheel = write_wheel(tmp_path / "dist", "alpha", "1.0", requires=("beta", "gamma"))
    wheelhouse = tmp_path / "wheelhouse"
    write_wheel(wheelhouse, "beta", "1.0+rocm9.9", build="wheelhouse")
    main = simple_index(tmp_path / "main", [write_wheel(tmp_path / "m", "gamma", "2.0", build="main")])
    extra = simple_index(
        tmp_path / "extra",
        [write_wheel(tmp_path / "e", "gamma", "1.0", build="extra"), write_wheel(tmp_path / "e", "beta", "1.1")],
    )
    results: dict[str, SmokeResult] = {}
    with static_server(main) as main_url, static_server(extra) as extra_url:
        pip_env.setenv("PIP_INDEX_URL", main_url)
        for installer in ("uv", "pip"):
            if installer == "pip":
                _without_uv(pip_env)
            results[installer] = smoke_test(
                wheel,
                Smoke(imports=("alpha",)),
                requirements=("beta==1.0+rocm9.9",),
                find_links=wheelhouse,
                index_urls=(extra_url,),
                checks=(_installed(tmp_path, installer),),
                scratch=tmp_path,
            )
    assert results["uv"].passed and "by pip" not in results["uv"].message, results["uv"].message
    assert results["pip"].passed and "(by pip: uv is not installed)" in results["pip"].message
    installed = json.loads((tmp_path / "uv").read_text())
    assert installed == [["alpha", "1.0", "ours"], ["beta", "1.0+rocm9.9", "wheelhouse"], ["gamma", "2.0", "main"]]
    assert json.loads((tmp_path / "pip").read_text()) == installed


@pytest.mark.slow
@pytest.mark.parametrize("installer", ["uv", "pip"])
def test_an_install_failure_gives_pips_error(tmp_path: Path, pip_env: pytest.MonkeyPatch, installer: str) -> None:
    """uv failing hands the install to pip, whose error the user has always been shown."""
    if installer == "pip":
        _without_uv(pip_env)
    pip_env.setenv("PIP_NO_INDEX", "1")
    wheel = write_wheel(tmp_path / "dist", "alpha", "1.0", requires=("delta",))
    result = smoke_test(wheel, Smoke(imports=("alpha",)), find_links=tmp_path / "dist", scratch=tmp_path)
    assert not result.passed and not result.skipped
    assert result.message.startswith("smoke test failed: command failed with exit code 1")
    assert "pip --python" in result.message and "No matching distribution found for delta" in result.message
    assert list(tmp_path.glob("rocwheels-smoke-*")) == []


@pytest.mark.slow
def test_pip_installs_where_uv_fails_or_a_setting_has_no_uv_equivalent(
    tmp_path: Path, pip_env: pytest.MonkeyPatch
) -> None:
    wheel = write_wheel(tmp_path / "dist", "alpha", "1.0")
    pip_env.setenv("PIP_NO_INDEX", "1")
    broken = tmp_path / "uv"
    broken.write_text("#!/bin/sh\necho 'error: uv stand-in refuses'\nexit 2\n")
    broken.chmod(0o755)
    pip_env.setattr(pip_config, "uv_binary", lambda: str(broken))
    after_uv = smoke_test(wheel, Smoke(imports=("alpha",)), scratch=tmp_path)
    assert after_uv.passed and "(by pip, after uv failed: error: uv stand-in refuses)" in after_uv.message
    pip_env.setenv("PIP_PREFER_BINARY", "1")
    unknown = smoke_test(wheel, Smoke(imports=("alpha",)), scratch=tmp_path)
    assert unknown.passed and "(by pip: pip setting prefer-binary has no uv equivalent here)" in unknown.message


# --- the GPU check: only on GPUs the wheel has code for (a stand-in GPU: tests/helpers/fake_gpu.py) ---

GPU_SENTINEL = Smoke(imports=("alpha",), gpu_code="raise SystemExit('the GPU check ran')")


def test_the_gpu_check_is_skipped_on_a_gpu_the_wheel_has_no_code_for(
    tmp_path: Path, pip_env: pytest.MonkeyPatch
) -> None:
    """A gfx942 build verified on a gfx90a host passes, saying why its GPU code was not run."""
    fake_gpus(tmp_path / "gpu", pip_env, 90010)
    wheel = write_wheel(tmp_path / "dist", "alpha", "1.0")
    result = smoke_test(wheel, GPU_SENTINEL, code_targets=[("gfx942",)], scratch=tmp_path)
    assert result.passed, result.message
    assert result.message.endswith("GPU check not run: the wheel has no code for gfx90a here (built for gfx942)")


def test_the_gpu_check_runs_on_a_gpu_the_wheel_has_code_for(tmp_path: Path, pip_env: pytest.MonkeyPatch) -> None:
    fake_gpus(tmp_path / "gpu", pip_env, 90010)
    wheel = write_wheel(tmp_path / "dist", "alpha", "1.0")
    result = smoke_test(wheel, GPU_SENTINEL, code_targets=[("gfx90a", "gfx942")], scratch=tmp_path)
    assert not result.passed and "the GPU check ran" in result.message
