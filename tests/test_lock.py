"""The version lock: the shipped one is consistent; an inconsistent one is refused clearly."""

import re
import subprocess
from pathlib import Path

import pytest

from pipeline.config.lock import check_lock, load_lock, select_line
from pipeline.config.recipes import load_recipes
from pipeline.errors import ConfigError, RocwheelsError
from tests.helpers import REPO, ROCWHEELS
from tests.helpers.recipes import ZERO_DIGEST, recipe_toml

LOCK = f"""default_line = "rocm6.2"
[lines."rocm6.2"]
rocm = "6.2.4"
builder_image = "registry.example/rocm/dev{ZERO_DIGEST}"
image_source = "SOURCE"
python = ["3.11"]
targets = ["gfx90a", "gfx942"]
[lines."rocm6.2".versions]
torch = "2.5.1"
torchvision = "0.20.1"

[[rules]]
package = "torch"
versions = "==2.5.*"
requires = {{ rocm = ">=6.1,<6.3" }}
source = "https://example.org/torch-matrix"

[[rules]]
package = "torchvision"
versions = "==0.20.*"
requires = {{ torch = "==2.5.*" }}
source = "https://example.org/vision-matrix"
"""


@pytest.fixture
def recipes_dir(tmp_path):
    (tmp_path / "torch.toml").write_text(recipe_toml("torch", "2.5.1"))
    (tmp_path / "torchvision.toml").write_text(recipe_toml("torchvision", "0.20.1", depends_on=("torch",)))
    return tmp_path


def check(recipes_dir: Path, lock_text: str) -> list[str]:
    (recipes_dir / "lock.toml").write_text(lock_text)
    return check_lock(load_lock(recipes_dir), load_recipes(recipes_dir))


def test_consistent_lock(recipes_dir):
    assert check(recipes_dir, LOCK.replace("SOURCE", "https://example.org/digests")) == []


def test_unverified_values_warn(recipes_dir):
    warnings = check(recipes_dir, LOCK.replace("SOURCE", "unverified: copied from a blog"))
    assert any("builder_image is unverified" in w for w in warnings)


@pytest.mark.parametrize(
    ("old", "new", "field", "words"),
    [
        (
            'rocm = "6.2.4"',
            'rocm = "6.4.1"',
            "lines.rocm6.2.versions.torch",
            "torch 2.5.1 requires rocm >=6.1,<6.3, but lines.rocm6.2.rocm = 6.4.1",
        ),
        (
            'torchvision = "0.20.1"',
            'torchvision = "0.21.0"',
            "lines.rocm6.2.versions.torchvision",
            "0.21.0 is not described in",
        ),
        (f'/rocm/dev{ZERO_DIGEST}"', '/rocm/dev:6.2.4-complete"', "lines.rocm6.2.builder_image", "not pinned"),
        ('default_line = "rocm6.2"', 'default_line = "rocm9"', "default_line", "not a line"),
        ('targets = ["gfx90a", "gfx942"]', 'targets = ["gfx42"]', "lines.rocm6.2.targets", "gfx42"),
        ('python = ["3.11"]', 'python = ["311"]', "lines.rocm6.2.python", "3.11"),
        ('versions = "==0.20.*"', 'versions = "0.20"', "rules.1.versions", "not a version specifier"),
        ('torch = "2.5.1"\n', "", "lines.rocm6.2.versions.torchvision", "depends on torch"),
        ("default_line", "schema_version = 99\ndefault_line", "schema_version", "reads lock schema 1, not 99"),
    ],
)
def test_inconsistent_lock_names_both_sides(recipes_dir, old, new, field, words):
    assert old in LOCK
    with pytest.raises(ConfigError) as caught:
        check(recipes_dir, LOCK.replace("SOURCE", "x").replace(old, new))
    assert caught.value.field == field
    assert str(recipes_dir / "lock.toml") in str(caught.value)
    assert words in str(caught.value)


def test_rule_mismatch_between_packages(recipes_dir):
    (recipes_dir / "torch.toml").write_text(recipe_toml("torch", "2.6.0"))
    lock = LOCK.replace("SOURCE", "x").replace('torch = "2.5.1"', 'torch = "2.6.0"')
    lock += '\n[[rules]]\npackage = "torch"\nversions = "==2.6.*"\nrequires = { rocm = ">=6.2" }\nsource = "s"\n'
    with pytest.raises(ConfigError) as caught:
        check(recipes_dir, lock)
    message = str(caught.value)
    assert "torchvision 0.20.1 requires torch ==2.5.*, but lines.rocm6.2.versions.torch = 2.6.0" in message
    assert "https://example.org/vision-matrix" in message


def test_two_lines_pin_two_versions_of_one_recipe(recipes_dir):
    both = recipe_toml("torch", "2.5.1") + '[versions."2.6.0".source]\npath = "."\n'
    (recipes_dir / "torch.toml").write_text(both)
    newer = (
        LOCK.split("[[rules]]")[0]
        .replace('"rocm6.2"', '"rocm6.3"')
        .replace('rocm = "6.2.4"', 'rocm = "6.3.1"')
        .replace('torch = "2.5.1"', 'torch = "2.6.0"')
    )
    rules = "[[rules]]" + "[[rules]]".join(LOCK.split("[[rules]]")[1:])
    rules += '\n[[rules]]\npackage = "torch"\nversions = "==2.6.*"\nrequires = { rocm = ">=6.3" }\nsource = "s"\n'
    rules = rules.replace('requires = { torch = "==2.5.*" }', 'requires = { torch = ">=2.5,<2.7" }')
    lock = LOCK.split("[[rules]]")[0] + newer.split("\n", 1)[1] + rules
    assert check(recipes_dir, lock.replace("SOURCE", "x")) == []
    lock_file = load_lock(recipes_dir)
    assert {name: line.versions["torch"] for name, line in lock_file.lock.lines.items()} == {
        "rocm6.2": "2.5.1",
        "rocm6.3": "2.6.0",
    }


def test_version_no_rule_covers(recipes_dir):
    (recipes_dir / "torch.toml").write_text(recipe_toml("torch", "2.7.0"))
    with pytest.raises(ConfigError, match=re.escape("no compatibility rule covers torch 2.7.0")):
        check(recipes_dir, LOCK.replace("SOURCE", "x").replace('torch = "2.5.1"', 'torch = "2.7.0"'))


def test_select_line(recipes_dir):
    (recipes_dir / "lock.toml").write_text(LOCK.replace("SOURCE", "x"))
    lock_file = load_lock(recipes_dir)
    assert select_line(lock_file, None)[0] == "rocm6.2"
    assert select_line(lock_file, None, host_rocm="6.2")[0] == "rocm6.2"
    with pytest.raises(RocwheelsError, match=r"no line .* for this host's ROCm 6.4"):
        select_line(lock_file, None, host_rocm="6.4")
    with pytest.raises(ConfigError, match="no ROCm line named 'rocm7'"):
        select_line(lock_file, "rocm7")


def test_shipped_lock_checks_clean():
    result = subprocess.run([*ROCWHEELS, "lock", "check"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "consistent" in result.stdout


def test_cli_refuses_inconsistent_lock(recipes_dir):
    (recipes_dir / "lock.toml").write_text(LOCK.replace("SOURCE", "x").replace('rocm = "6.2.4"', 'rocm = "6.4.1"'))
    result = subprocess.run(
        [*ROCWHEELS, "--recipes-dir", recipes_dir, "lock", "check"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2  # a wrong lock is bad input
    assert "Traceback" not in result.stderr
    assert "lines.rocm6.2.versions.torch" in result.stderr and "6.4.1" in result.stderr


def two_rocm_lines(label: str = "") -> str:
    """The canary on ROCm 7.2 and ROCm 10.0, the newer line with ``label`` if given."""
    line = 'rocm = "{rocm}"\nbuilder_image = "registry.example/rocm/dev' + ZERO_DIGEST + '"\nimage_source = "x"\n'
    line += 'python = ["3.11"]\ntargets = ["gfx942"]\n'
    return (
        'default_line = "rocm7.2"\n'
        + '[lines."rocm7.2"]\n'
        + line.format(rocm="7.2.1")
        + '[lines."rocm7.2".versions]\ncanary = "1.0"\n'
        + '[lines."rocm10.0"]\n'
        + line.format(rocm="10.0.0")
        + (f'label = "{label}"\n' if label else "")
        + '[lines."rocm10.0".versions]\ncanary = "1.0"\n'
    )


def test_labels_that_sort_against_their_rocm_releases_are_refused(recipes_dir):
    """PEP 440: +rocm10.0 < +rocm7.2 (text), so an unpinned install would take ROCm 7.2's build."""
    (recipes_dir / "canary.toml").write_text(recipe_toml("canary"))
    with pytest.raises(ConfigError) as refused:
        check(recipes_dir, two_rocm_lines())
    message = str(refused.value)
    assert str(recipes_dir / "lock.toml") in message and "lines.rocm10.0.label" in message
    assert "canary 1.0+rocm10.0 (lines.rocm10.0, ROCm 10.0.0) sorts below canary 1.0+rocm7.2 (lines.rocm7.2" in message
    assert "a label that sorts above +rocm7.2" in message
    with pytest.raises(ConfigError, match=re.escape("sorts the same as canary 1.0+rocm7.2")):
        check(recipes_dir, two_rocm_lines("rocm7.2"))
    assert check(recipes_dir, two_rocm_lines("therock10.0")) == []


def test_a_label_a_package_gives_itself_is_checked_in_its_recipe(recipes_dir):
    (recipes_dir / "canary.toml").write_text('local_version = "rocm{rocm_short_digits}"\n' + recipe_toml("canary"))
    with pytest.raises(ConfigError) as refused:
        check(recipes_dir, two_rocm_lines("therock10.0"))
    message = str(refused.value)
    assert str(recipes_dir / "canary.toml") in message and "local_version" in message
    assert "1.0+rocm100" in message and "1.0+rocm72" in message and "{line_label}" in message


def test_a_label_must_be_a_local_version(recipes_dir):
    (recipes_dir / "canary.toml").write_text(recipe_toml("canary"))
    with pytest.raises(ConfigError, match="not a PEP 440 local label"):
        check(recipes_dir, two_rocm_lines("ROCm 10"))
