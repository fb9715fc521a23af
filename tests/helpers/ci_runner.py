"""A small CI runner for the tests: the jobs of .github/workflows/wheels.yml and .gitlab-ci.yml run on
this host, in stage order, each in a workspace of its own, artifacts passed between them through folders.

A workspace is the checkout as a CI runner sees it, made of links to the real one (Makefile,
pipeline/, recipes/, the venv ...) plus its own wheelhouse/ and build/, so job steps run exactly as
written. Only what a step needs from the CI service is provided: GitHub's expressions over vars,
secrets, matrix, needs and steps, ``$GITHUB_OUTPUT``, checkout and the artifact actions; GitLab's
stages, needs, artifacts, ``rules: if: $VAR``, a trigger of a child pipeline from an artifact.
The pipeline runs as for a tag, so the publish jobs run too.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML

from pipeline.util.cmd import run

# What a job's checkout holds from the real one (the rest, wheelhouse/ and build/, is its own).
CHECKOUT = ("Makefile", "pyproject.toml", "README.md", "pipeline", "recipes", "docker", ".venv")
_EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
GITLAB_KEYWORDS = {
    "stages",
    "variables",
    "default",
    "workflow",
    "include",
    "image",
    "services",
    "before_script",
    "after_script",
    "cache",
}


def load_yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text())


class Runner:
    def __init__(self, repo: Path, root: Path, env: Mapping[str, str]) -> None:
        self.repo, self.root = repo, root
        self.env = {**env, "PATH": f"{repo / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
        self.artifacts = root / "artifacts"
        self.ran: list[str] = []  # job names, in the order they ran

    def workspace(self, name: str) -> Path:
        folder = self.root / "jobs" / re.sub(r"[^A-Za-z0-9._-]+", "_", name)
        folder.mkdir(parents=True)
        for entry in CHECKOUT:
            (folder / entry).symlink_to(self.repo / entry)
        return folder

    def script(self, text: str, workspace: Path, env: Mapping[str, str]) -> None:
        run(["bash", "-eo", "pipefail", "-c", text], cwd=workspace, env={**self.env, **env})

    def keep(self, name: str, workspace: Path, patterns: list[str]) -> Path:
        """Copy what ``patterns`` match in the workspace to the artifact ``name``, keeping their paths."""
        found = sorted({path for pattern in patterns for path in workspace.glob(pattern) if path.is_file()})
        assert found, f"{name}: no file matches {patterns} in {workspace}"
        store = self.artifacts / name
        for path in found:
            target = store / path.relative_to(workspace)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        return store

    # --- GitHub Actions ---

    def github(self, workflow: Path, *, variables: Mapping[str, str], secrets: Mapping[str, str]) -> None:
        document = load_yaml(workflow)
        context: dict[str, Any] = {"vars": variables, "secrets": secrets, "github": {"ref": "refs/tags/v0.0.0-test"}}
        env = {key: str(_substitute(value, context)) for key, value in document.get("env", {}).items()}
        outputs: dict[str, dict[str, str]] = {}
        for job_id in _in_needs_order(document["jobs"]):
            job = document["jobs"][job_id]
            needs = job.get("needs", [])
            job_context = {
                **context,
                "needs": {n: {"outputs": outputs.get(n, {})} for n in ([needs] if isinstance(needs, str) else needs)},
            }
            matrix = job.get("strategy", {}).get("matrix")
            entries: list[dict[str, str]] = [{}]
            if matrix is not None:
                value = _substitute(matrix, job_context)
                if not value:  # the job's `if:` skips a stage the plan does not use
                    continue
                entries = value["include"]
            for number, entry in enumerate(entries):
                outputs[job_id] = self._github_job(
                    f"{job_id}-{number}", job, env, {**job_context, "matrix": entry, "steps": {}}
                )

    def _github_job(
        self, name: str, job: dict[str, Any], env: dict[str, str], context: dict[str, Any]
    ) -> dict[str, str]:
        self.ran.append(name)
        workspace = self.workspace(name)
        output_file = workspace / ".github-output"
        for step in job["steps"]:
            action = step.get("uses", "")
            inputs = {key: str(_substitute(value, context)) for key, value in step.get("with", {}).items()}
            if action.startswith("actions/checkout@"):
                continue  # the workspace is the checkout
            if action.startswith("actions/upload-artifact@"):
                self._upload(inputs["name"], workspace, [p for p in inputs["path"].splitlines() if p.strip()])
            elif action.startswith("actions/download-artifact@"):
                assert inputs.get("merge-multiple", "").lower() == "true", (
                    "the template merges artifacts into one folder"
                )
                for store in sorted(self.artifacts.iterdir()) if self.artifacts.is_dir() else []:
                    if fnmatch.fnmatch(store.name, inputs["pattern"]):
                        shutil.copytree(store, workspace / inputs["path"], dirs_exist_ok=True)
            else:
                assert not action, f"{name}: the runner knows no action {action}"
                step_env = {key: str(_substitute(value, context)) for key, value in step.get("env", {}).items()}
                output_file.write_text("")
                self.script(
                    str(_substitute(step["run"], context)),
                    workspace,
                    {**env, **step_env, "GITHUB_OUTPUT": str(output_file)},
                )
                if "id" in step:
                    values = dict(line.split("=", 1) for line in output_file.read_text().splitlines() if "=" in line)
                    context["steps"][step["id"]] = {"outputs": values}
        return {key: str(_substitute(value, context)) for key, value in job.get("outputs", {}).items()}

    def _upload(self, name: str, workspace: Path, patterns: list[str]) -> None:
        """As upload-artifact@v4: the files keep their paths below the matches' common folder."""
        store = self.keep(name + ".staging", workspace, patterns)
        files = [p for p in store.rglob("*") if p.is_file()]
        base = Path(os.path.commonpath([p.parent for p in files]))
        shutil.copytree(base, self.artifacts / name)
        shutil.rmtree(store)

    # --- GitLab CI ---

    def gitlab(self, pipeline: Path, *, variables: Mapping[str, str]) -> None:
        self._gitlab_pipeline(load_yaml(pipeline), dict(variables), {})

    def _gitlab_pipeline(self, document: dict[str, Any], variables: dict[str, str], forwarded: dict[str, str]) -> None:
        # Precedence as GitLab's: project variables over variables the trigger forwards over the file's own.
        settings = {**document.get("variables", {}), **forwarded, **variables}
        jobs = {name: job for name, job in document.items() if name not in GITLAB_KEYWORDS and not name.startswith(".")}
        done: list[str] = []
        for stage in document["stages"]:
            for name, job in jobs.items():
                if job.get("stage") != stage or not self._rules_allow(job, settings):
                    continue
                if "trigger" in job:
                    include = job["trigger"]["include"][0]
                    child = load_yaml(self.artifacts / include["job"] / include["artifact"])
                    self._gitlab_pipeline(child, variables, {**document.get("variables", {}), **forwarded})
                    continue
                self.ran.append(name)
                workspace = self.workspace(name)
                needs = [need if isinstance(need, str) else need["job"] for need in job.get("needs", done)]
                for need in needs:
                    if (self.artifacts / need).is_dir():
                        shutil.copytree(self.artifacts / need, workspace, dirs_exist_ok=True, symlinks=True)
                self.script("\n".join(job["script"]), workspace, {**settings, **job.get("variables", {})})
                if "artifacts" in job:
                    self.keep(name, workspace, job["artifacts"]["paths"])
                done.append(name)

    @staticmethod
    def _rules_allow(job: dict[str, Any], settings: Mapping[str, str]) -> bool:
        rules = job.get("rules")
        if rules is None:
            return True
        for rule in rules:
            variable = re.fullmatch(r"\$(\w+)", rule["if"])
            assert variable, f"the runner reads `if: $VARIABLE` rules only, not {rule['if']!r}"
            if settings.get(variable[1]):
                return True
        return False


def _in_needs_order(jobs: dict[str, Any]) -> list[str]:
    ordered: list[str] = []

    def visit(name: str) -> None:
        if name not in ordered:
            needs = jobs[name].get("needs", [])
            for need in [needs] if isinstance(needs, str) else needs:
                visit(need)
            ordered.append(name)

    for name in jobs:
        visit(name)
    return ordered


def _substitute(value: Any, context: Mapping[str, Any]) -> Any:
    """``${{ ... }}`` in ``value``: the whole value when it is one expression, else as text."""
    if not isinstance(value, str):
        return value
    whole = _EXPRESSION.fullmatch(value.strip())
    if whole:
        return _evaluate(whole[1], context)
    return _EXPRESSION.sub(lambda match: str(_evaluate(match[1], context)), value)


def _evaluate(expression: str, context: Mapping[str, Any]) -> Any:
    """The expressions the templates use: a.b.c lookups, 'literals', fromJSON(x) and x || y."""
    value: Any = ""
    for alternative in (part.strip() for part in expression.split("||")):
        function = re.fullmatch(r"fromJSON\((.*)\)", alternative)
        if function:
            text = _evaluate(function[1], context)
            value = json.loads(text) if text else ""
        elif alternative.startswith("'"):
            value = alternative.strip("'")
        else:
            value = context
            for part in alternative.split("."):
                value = value.get(part, "") if isinstance(value, Mapping) else ""
        if value:
            return value
    return value
