"""PEP 825 variant wheels: labels, variant.json, verify's check, the index's variants.json, and what
the real installers do with them (pip 23.2.1 and 26, uv 0.13 with its wheel-variants preview, and
AMD's provider run through variantlib)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote

import pytest

from pipeline.config.lock import load_lock
from pipeline.config.targets import parse_targets
from pipeline.description import wheel_variant
from pipeline.errors import RocwheelsError
from pipeline.publish.index import build_static_index, page_links, write_constraints, write_requirements
from pipeline.util.cmd import run
from pipeline.verify.verify import ERROR, variant_findings
from pipeline.wheel.archive import check_wheel, parse_wheel_name, split_variant
from pipeline.wheel.variant import WheelVariant, make_variant, read_variant, variant_label

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.1.0+rocm6.2"


def test_label_is_the_sorted_processors_or_a_hash():
    assert variant_label(["gfx942"]) == "gfx942"
    assert variant_label(["gfx942", "gfx90a", "gfx942"]) == "gfx90a_gfx942"
    long = variant_label(["gfx908", "gfx90a", "gfx942", "gfx1100"])
    assert len(long) == 16 and long.startswith("t") and long == variant_label(["gfx1100", "gfx942", "gfx90a", "gfx908"])


def test_the_lines_default_targets_make_the_plain_build():
    line = load_lock(REPO / "recipes").line("debian12")
    every = wheel_variant(line.default_targets, line)
    one = wheel_variant(parse_targets("gfx90a"), line)
    assert every is not None and every.plain and len(every.label) <= 16
    assert one == WheelVariant("gfx90a", ("gfx90a",), plain=False)
    # A generic target stands for its members: the values a GPU's provider reports.
    generic = wheel_variant(parse_targets("gfx11-generic"), line)
    assert generic is not None and "gfx1100" in generic.processors and "-" not in generic.label


def _variant(make_wheel, folder: Path, processors: tuple[str, ...], build: str = "ours") -> Path:
    plain = make_wheel(folder / "plain" / build, "rocm-canary", VERSION, build)
    variant = WheelVariant(variant_label(processors), processors, plain=False)
    return make_variant(plain, folder, variant)


def test_variant_wheel_is_the_wheel_plus_variant_json(tmp_path, make_wheel):
    wheel = _variant(make_wheel, tmp_path, ("gfx90a", "gfx942"))
    assert wheel.name == "rocm_canary-0.1.0+rocm6.2-py3-none-any-gfx90a_gfx942.whl"
    assert split_variant(wheel.name) == ("rocm_canary-0.1.0+rocm6.2-py3-none-any.whl", "gfx90a_gfx942")
    assert str(parse_wheel_name(wheel.name)[1]) == VERSION
    check_wheel(wheel)  # RECORD lists variant.json with its hash
    found = read_variant(wheel)
    assert found is not None and found.label == "gfx90a_gfx942" and found.processors == ("gfx90a", "gfx942")
    data = json.loads(found.dist_info.to_str())
    assert data["providers"]["amd"]["plugin-api"] == "rocm_bootstrap.variant_provider:AMDVariantPlugin"
    assert data["default-priorities"]["namespace"] == ["amd"]
    # The same wheel makes the same variant, byte for byte.
    again = _variant(make_wheel, tmp_path / "again", ("gfx942", "gfx90a"))
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(wheel.read_bytes()).digest()


def test_verify_compares_variant_properties_with_code_objects(tmp_path, make_wheel):
    wheel = _variant(make_wheel, tmp_path, ("gfx90a", "gfx942"))
    ok = variant_findings(wheel, {"lib/a.so": ("gfx90a",), "lib/b.so": ("gfx942",)})
    assert [f.level for f in ok] == ["ok"]
    wrong = variant_findings(wheel, {"lib/a.so": ("gfx90a",)})
    assert [f.level for f in wrong] == [ERROR]
    assert "says gfx90a, gfx942, the code objects run on gfx90a" in wrong[0].message
    renamed = wheel.with_name(wheel.name.replace("gfx90a_gfx942", "gfx942"))
    shutil.copy(wheel, renamed)
    assert "the file name says gfx942" in variant_findings(renamed, {})[0].message
    plain = make_wheel(tmp_path / "p", "rocm-canary", VERSION)
    assert variant_findings(plain, {"lib/a.so": ("gfx942",)}) == []


def test_a_label_longer_than_pep_825_allows_is_refused(tmp_path, make_wheel):
    plain = make_wheel(tmp_path, "rocm-canary", VERSION)
    with pytest.raises(RocwheelsError, match="not a PEP 825 label"):
        make_variant(plain, tmp_path, WheelVariant("gfx90a_gfx942_gfx1100", ("gfx90a",), plain=False))


@pytest.fixture
def variant_house(tmp_path: Path, make_wheel: Callable[..., Path]) -> Path:
    """One release of the canary: the plain wheel and the variants for gfx90a and gfx942."""
    house = tmp_path / "wheelhouse"
    make_wheel(house, "rocm-canary", VERSION, "plain")
    for processors in (("gfx90a",), ("gfx942",)):
        _variant(make_wheel, house, processors, build=processors[0])
    return house


def test_index_lists_variants_json_and_pins_the_plain_wheel(variant_house):
    (root,) = build_static_index(variant_house)
    links = page_links((root / "rocm-canary" / "index.html").read_text())
    names = [unquote(link.split("#")[0].removeprefix("../../../")) for link in links]
    assert "rocm_canary-0.1.0+rocm6.2-variants.json" in names
    assert {n for n in names if n.endswith(".whl")} == {
        "rocm_canary-0.1.0+rocm6.2-py3-none-any.whl",
        "rocm_canary-0.1.0+rocm6.2-py3-none-any-gfx90a.whl",
        "rocm_canary-0.1.0+rocm6.2-py3-none-any-gfx942.whl",
    }
    merged = json.loads((variant_house / "rocm_canary-0.1.0+rocm6.2-variants.json").read_text())
    assert merged["variants"] == {
        "gfx90a": {"amd": {"gfx_arch": ["gfx90a"]}},
        "gfx942": {"amd": {"gfx_arch": ["gfx942"]}},
    }
    (requirements,) = write_requirements(variant_house)
    plain_sha = hashlib.sha256((variant_house / "rocm_canary-0.1.0+rocm6.2-py3-none-any.whl").read_bytes()).hexdigest()
    assert requirements.read_text().count("--hash=") == 1 and plain_sha in requirements.read_text()
    (constraints,) = write_constraints(variant_house)
    assert "rocm-canary==0.1.0+rocm6.2" in constraints.read_text()


def test_a_variant_added_later_is_merged_in(variant_house, make_wheel):
    build_static_index(variant_house)
    _variant(make_wheel, variant_house, ("gfx1030",), build="gfx1030")
    build_static_index(variant_house)
    merged = json.loads((variant_house / "rocm_canary-0.1.0+rocm6.2-variants.json").read_text())
    assert sorted(merged["variants"]) == ["gfx1030", "gfx90a", "gfx942"]


RESOLVE = """
import json, sys
from variantlib.api import get_variants_by_priority
from variantlib.variants_json import VariantsJson
print(" ".join(d.label for d in get_variants_by_priority(variants_json=VariantsJson(json.load(open(sys.argv[1]))))))
"""


@pytest.mark.parametrize(("gpu", "label"), [("gfx942", "gfx942"), ("gfx90a", "gfx90a"), ("gfx1100", None)])
def test_amds_provider_picks_the_build_for_the_gpu(variant_house, gpu, label):
    """rocm-bootstrap's AMDVariantPlugin, run by variantlib's resolver on the index's variants.json,
    with the GPU forced as on a machine without one: the build for that GPU first, then only the
    ``null`` fallback (the plain wheel); a GPU no build serves gets the fallback alone. One process
    per GPU, as installers run: the provider's answer is cached within a process."""
    build_static_index(variant_house)
    variants_json = variant_house / "rocm_canary-0.1.0+rocm6.2-variants.json"
    env = {**os.environ, "ROCM_BOOTSTRAP_FORCE_GFX_ARCH": gpu}
    chosen = run([sys.executable, "-c", RESOLVE, variants_json], env=env).output.split()
    assert chosen == ([label, "null"] if label else ["null"])


# --- the real installers against a static index holding the plain wheel and its variants ---


def _tool_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))}
    return {
        **env,
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_CACHE_DIR": "1",
        "UV_NO_CONFIG": "1",
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
    }


def _installed(python: Path) -> str:
    return run([python, "-c", "import rocm_canary; print(rocm_canary.BUILD)"]).output.strip()


@pytest.mark.network
@pytest.mark.parametrize("pip", ["pip==23.2.1", "pip>=26,<27"])
def test_pip_installs_the_plain_wheel_beside_variants(tmp_path, variant_house, static_server, pip):
    """Old and new pips skip the variant file names they cannot read and take the plain wheel."""
    build_static_index(variant_house)
    run([sys.executable, "-m", "venv", tmp_path / "venv"])
    python = tmp_path / "venv" / "bin" / "python"
    run([python, "-m", "pip", "install", "-q", pip])
    with static_server(variant_house) as url:
        run(
            [python, "-m", "pip", "install", "--index-url", f"{url}simple/rocm6.2/", "rocm-canary==" + VERSION],
            env=_tool_env(tmp_path),
        )
    assert _installed(python) == "plain"


README_URL = "http://buildhost:8000/simple/rocm6.2/"


def readme_uv_command() -> list[str]:
    """The uv command of the README's teammates' section, as a teammate types it."""
    section = (REPO / "README.md").read_text().split("### As a teammate", 1)[1].split("\n#", 1)[0]
    (line,) = [line.strip() for line in section.splitlines() if line.strip().startswith("uv pip install")]
    return shlex.split(line)


@pytest.mark.network
def test_uv_with_wheel_variants_skips_amds_provider(tmp_path, variant_house, static_server):
    """uv 0.13 runs only the providers it builds in (NVIDIA, TPU, x86-64, aarch64): the README's
    command, with the wheel-variants preview on and a GPU forced, still takes the plain wheel; a
    release with only AMD variants is refused, never installed for the wrong GPU."""
    build_static_index(variant_house)
    uv = shutil.which("uv", path=sysconfig.get_path("scripts"))
    assert uv, "uv comes with rocwheels' environment"
    env = {**_tool_env(tmp_path), "ROCM_BOOTSTRAP_FORCE_GFX_ARCH": "gfx942"}
    run([uv, "venv", "-q", "--python", sys.executable, tmp_path / "venv"], env=env)
    python = tmp_path / "venv" / "bin" / "python"
    words = readme_uv_command()
    assert words[:3] == ["uv", "pip", "install"]
    with static_server(variant_house) as url:
        install = [
            uv,
            "pip",
            "install",
            "-v",
            "--python",
            python,
            *(w.replace(README_URL, f"{url}simple/rocm6.2/") for w in words[3:]),
        ]
        out = run(install, env=env).output
        assert "Skipping unsupported wheel variant provider `rocm_bootstrap.variant_provider:AMDVariantPlugin`" in out
        assert _installed(python) == "plain"
        (variant_house / "rocm_canary-0.1.0+rocm6.2-py3-none-any.whl").unlink()
        build_static_index(variant_house)
        run([uv, "pip", "uninstall", "--python", python, "rocm-canary"], env=env)
        refused = run([*install, "--refresh"], env=env, check=False)
    assert refused.returncode != 0
    assert "has only unsupported wheel variants" in refused.output


def test_a_variant_wheel_found_on_its_own_gets_a_python_for_its_smoke_test() -> None:
    """packaging's parser rejects the label; the smoke test must still find the wheel's interpreter."""
    import sys

    from pipeline.verify.smoke import interpreter_for

    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    assert interpreter_for(Path(f"alpha-1.0-{tag}-{tag}-linux_x86_64-gfx942.whl")) == sys.executable


def test_a_variant_wheel_found_on_its_own_passes_its_smoke_test(tmp_path, make_wheel):
    """pip reads no variant names: the smoke test installs the variant wheel's own bytes under its plain name."""
    from pipeline.config.recipes import Smoke
    from pipeline.verify.smoke import smoke_test

    variant = _variant(make_wheel, tmp_path, ("gfx942",))
    result = smoke_test(variant, Smoke(imports=("rocm_canary",)), scratch=tmp_path)
    assert result.passed, result.message
