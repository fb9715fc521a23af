"""Recipes: one declarative TOML file per package in ``recipes/`` (documented in recipes/README.md)."""

from __future__ import annotations

import re
import string
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal
from urllib.parse import unquote, urlsplit

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version
from pydantic import AfterValidator, PositiveFloat, PositiveInt, StrictBool, field_validator, model_validator

from pipeline.config.models import Model, plain_name, read_toml, validate
from pipeline.config.targets import known_processor_list
from pipeline.errors import ConfigError, RocwheelsError
from pipeline.repair.policy import LinkPackage

# What ``{...}`` in a recipe's env and pre-build commands may refer to; filled in by the plan.
PLACEHOLDERS = {
    "version": "the recipe's version, e.g. 2.5.1",
    "local_version": "the recipe's resolved local version label, e.g. rocm6.2",
    "line_label": "the lock line's local version label, e.g. rocm6.2 (its label, else rocm<major>.<minor>)",
    "rocm": "the lock line's ROCm release, e.g. 6.2.4",
    "rocm_short": "major.minor of the ROCm release, e.g. 6.2",
    "rocm_digits": "the first three digits of the ROCm release, e.g. 624",
    "rocm_short_digits": "the digits of major.minor of the ROCm release, e.g. 72 for 7.2.1",
    "rocm_path": "the ROCm install prefix, e.g. /opt/rocm",
    "targets": "the GPU targets in the recipe's own format ([targets] separator/prefix)",
    "jobs": "parallel compile jobs",
}

# What a +local label may be made of: the lock line's ROCm release only.
_LABEL_PLACEHOLDERS = ("line_label", "rocm", "rocm_short", "rocm_digits", "rocm_short_digits")
LOCK_FILE = "lock.toml"
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")


URL_SCHEMES = ("https", "http", "file")


class Source(Model):
    """Where the source comes from: exactly one of ``path``, ``url`` (+ sha256), ``git`` (+ commit)."""

    path: str | None = None
    url: str | None = None
    sha256: str | None = None
    git: str | None = None
    commit: str | None = None
    submodules: StrictBool = False
    subdir: str | None = None

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Source:
        kinds = [k for k in ("path", "url", "git") if getattr(self, k)]
        if len(kinds) != 1:
            raise ValueError(f"path: give exactly one of path, url, git (got: {', '.join(kinds) or 'none'})")
        if self.url and urlsplit(self.url).scheme not in URL_SCHEMES:
            raise ValueError(
                f"url: {self.url!r} has no scheme rocwheels downloads; write the full address ({' or '.join(URL_SCHEMES)}://...)"
            )
        if self.url and not re.fullmatch(r"[0-9a-f]{64}", self.sha256 or ""):
            raise ValueError("sha256: a url source needs sha256 = 64 lowercase hex digits (sha256sum of the archive)")
        if self.git and not re.fullmatch(r"[0-9a-f]{40}", self.commit or ""):
            raise ValueError(
                "commit: a git source needs commit = the full 40-hex commit id (a tag or short id can move)"
            )
        if self.sha256 and not self.url:
            raise ValueError("sha256: belongs to a url source")
        if self.commit and not self.git:
            raise ValueError("commit: belongs to a git source")
        if self.submodules and not self.git:
            raise ValueError("submodules: belongs to a git source")
        if self.path and self.path != ".":
            plain_name(self.path, "path: a folder next to the recipe files:")
        if self.subdir:
            plain_name(self.subdir, "subdir: a folder of the source:")
        return self


class BuildWheel(Model):
    """A prebuilt wheel the package is built against, installed into the build environment
    (torch from a vendor's wheel file, say); its wheels then require exactly that build."""

    url: str  # https:// or file://; the file name must be the wheel's own
    sha256: str

    @model_validator(mode="after")
    def _checked_wheel(self) -> BuildWheel:
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise ValueError("sha256: 64 lowercase hex digits (sha256sum of the wheel file)")
        try:
            parse_wheel_filename(self.filename)
        except InvalidWheelFilename:
            raise ValueError(
                f"url: {self.filename!r} is not a wheel file name (name-version-python-abi-platform.whl)"
            ) from None
        return self

    @property
    def filename(self) -> str:
        return unquote(urlsplit(self.url).path.rsplit("/", 1)[-1])

    @property
    def pin(self) -> tuple[str, str]:
        """(distribution, exact version) of this build: ``("torch", "2.13.0+cpu")``."""
        name, version = parse_wheel_filename(self.filename)[:2]
        return str(name), str(version)


class Build(Model):
    """How the wheel is built: pre-build shell commands, then ``python -m build --wheel``."""

    pre: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    isolation: StrictBool = True
    requires: tuple[str, ...] = ()
    wheels: tuple[BuildWheel, ...] = ()  # installed (hash-checked, without dependencies) before the build
    # A CI job's time limit for one Python's wheel (GitLab stops a job at 60 minutes unless told).
    timeout_minutes: PositiveInt = 60

    @model_validator(mode="after")
    def _wheels_need_the_outer_environment(self) -> Build:
        if self.wheels and self.isolation:
            raise ValueError(
                "wheels: build wheels go into the build environment, which an isolated build does not see: set isolation = false"
            )
        return self


class Fallback(Model):
    """Another way to build the package for targets ``supported`` does not cover (flash-attention:
    its Triton backend where the CK kernels have no RDNA code)."""

    supported: Annotated[tuple[str, ...], AfterValidator(known_processor_list)]
    env: dict[str, str]  # set for the build and for the smoke test
    gpu_code: StrictBool = True  # False: the wheel carries no GPU code objects (kernels compiled at run time)


class Targets(Model):
    """How the recipe receives GPU targets, and which it supports."""

    env: str
    separator: str = ";"
    prefix: str = ""
    supported: Annotated[tuple[str, ...], AfterValidator(known_processor_list)]
    fallback: Fallback | None = None

    @property
    def buildable(self) -> tuple[str, ...]:
        """Every processor the recipe builds for: its own, then its fallback's."""
        return (*self.supported, *(self.fallback.supported if self.fallback else ()))


class Repair(Model):
    """Recipe-specific repair policy on top of rocwheels' ROCm exclusion list."""

    exclude: tuple[str, ...] = ()
    rpath: tuple[str, ...] = ()
    link_packages: tuple[str, ...] = ()

    @field_validator("link_packages")
    @classmethod
    def _link_format(cls, entries: tuple[str, ...]) -> tuple[str, ...]:
        for entry in entries:
            try:
                LinkPackage.parse(entry)
            except RocwheelsError as exc:
                raise ValueError(f"{exc.message} ({exc.fix})") from None
        return entries


class Smoke(Model):
    """The import check run in a fresh venv; ``gpu_code`` only runs where the host's GPUs are ones
    the wheel has code for (:func:`pipeline.verify.host_gpus.gpu_check`)."""

    imports: tuple[str, ...]
    code: str | None = None
    gpu_code: str | None = None
    env: dict[str, str] = {}  # set before anything is imported (a backend switch read at import)

    def snippets(self, *, gpu: bool) -> list[str]:
        """The Python snippets to run, in order (``gpu_code`` only with ``gpu``: where it can run)."""
        codes = (self.code, self.gpu_code if gpu else None)
        setup = f"import os; os.environ.update({dict(sorted(self.env.items()))!r}); " if self.env else ""
        return [f"{setup}import {module}" for module in self.imports] + [setup + code for code in codes if code]


# What ``{...}`` in a [preflight] flag may refer to besides the plan's placeholders: filled per unit.
UNIT_PLACEHOLDERS = {
    "target": "the GPU processor this unit is compiled for, e.g. gfx942 (one compile per requested target)",
    "python_include": "the include folder of the build environment's Python (Python.h)",
}
DEFAULT_UNIT_TIME_LIMIT = 600.0


def _source_glob(pattern: str) -> str:
    """A glob inside the source folder: relative, no ``..``."""
    path = PurePosixPath(pattern)
    if not pattern or path.is_absolute() or ".." in path.parts:
        raise ValueError(f"{pattern!r} must be a glob relative to the source folder, without '..'")
    return pattern


SourceGlob = Annotated[str, AfterValidator(_source_glob)]


class PreflightSample(Model):
    """One group of the build's translation units, and which of them the preflight compiles for it."""

    name: str
    units: SourceGlob  # the group: every unit of the full build it stands for in the projection
    # The units to compile (the first ``count`` by name of the group's units this glob takes);
    # unset: the group's own first ones.
    sample: SourceGlob | None = None
    count: PositiveInt = 1
    # The sample is the group's cheapest units, chosen so the preflight takes minutes: the group's
    # projected time is then a lower bound, and the report says so.
    cheapest: StrictBool = False


class Preflight(Model):
    """How the recipe's translation units and their compile commands are found, for ``wheels --preflight``:
    the sources after ``generate``, each compiled alone as ``compiler *flags -c SOURCE -o OBJECT``."""

    generate: tuple[str, ...] = ()  # run in the source folder after [build] pre (a kernel generator, hipify)
    units: tuple[SourceGlob, ...]  # every translation unit of the full build
    sample: tuple[PreflightSample, ...] = ()
    compiler: str = "hipcc"
    flags: tuple[str, ...] = ()
    # Variables of the build environment whose value (split as a shell splits words) the package's
    # build adds to its compile flags (the canary's ROCM_CANARY_HIPCC_FLAGS).
    env_flags: tuple[str, ...] = ()
    language: Literal["hip"] | None = None  # "hip": -x hip for units whose name does not say so (.cpp)
    unit_time_limit: PositiveFloat = DEFAULT_UNIT_TIME_LIMIT

    @model_validator(mode="after")
    def _checked(self) -> Preflight:
        if not self.units:
            raise ValueError('units: name the globs of every translation unit, e.g. units = ["csrc/**/*.cpp"]')
        names = [group.name for group in self.sample]
        if len(set(names)) != len(names):
            raise ValueError(f"sample: group names must differ (got {', '.join(names)})")
        for index, command in enumerate(self.generate):
            _check_placeholders(command, f"generate[{index}]")
        for index, flag in enumerate(self.flags):
            _check_placeholders(flag, f"flags[{index}]", allowed=(*PLACEHOLDERS, *UNIT_PLACEHOLDERS))
        return self


def _env_placeholders(env: dict[str, str]) -> dict[str, str]:
    for key, value in env.items():
        _check_placeholders(value, key)
    return env


def _label_placeholders(label: str) -> str:
    _check_placeholders(label, "", allowed=_LABEL_PLACEHOLDERS)
    return label


# An [env] table whose values may use the plan's placeholders, and a +local label built from the line's ROCm.
EnvTable = Annotated[dict[str, str], AfterValidator(_env_placeholders)]
Label = Annotated[str, AfterValidator(_label_placeholders)]


class Release(Model):
    """What one version of a package needs: its pinned source and what differs from the package-wide data."""

    source: Source
    local_version: Label | None = None  # overrides the recipe's local_version
    env: EnvTable = {}  # added to, or overriding, the recipe's [env]
    requires: tuple[str, ...] = ()  # build requirements of this version, on top of [build] requires
    targets: Annotated[tuple[str, ...], AfterValidator(known_processor_list)] | None = (
        None  # overrides [targets] supported
    )


class RecipeFile(Model):
    """A recipe as written: one package, every version it can build (``[versions."X"]``).

    The lock line picks the version; :meth:`at` gives the :class:`Recipe` for it.
    """

    name: str
    distribution: str | None = None
    # The +local label the package's build gives its wheel; most take it from the environment.
    local_version: Label = "{line_label}"
    description: str = ""
    build: Build = Build()
    env: EnvTable = {}
    targets: Targets
    depends_on: tuple[str, ...] = ()
    repair: Repair = Repair()
    smoke: Smoke
    preflight: Preflight | None = None
    versions: dict[str, Release]

    @field_validator("versions")
    @classmethod
    def _pep440_keys(cls, versions: dict[str, Release]) -> dict[str, Release]:
        if not versions:
            raise ValueError('describe at least one version: [versions."1.2.3"] with its source')
        for version in versions:
            try:
                parsed = Version(version)
            except InvalidVersion:
                raise ValueError(f"{version}: not a PEP 440 version") from None
            if parsed.local:
                raise ValueError(
                    f"{version}: leave out the local part (+rocm...): rocwheels adds it from the lock line"
                )
        return versions

    @field_validator("build")
    @classmethod
    def _known_placeholders_in_pre(cls, build: Build) -> Build:
        for index, command in enumerate(build.pre):
            _check_placeholders(command, f"pre[{index}]")
        return build

    @property
    def dist_name(self) -> str:
        """The project name its wheels carry (normalized as in wheel file names)."""
        return canonicalize_name(self.distribution or self.name).replace("-", "_")

    def at(self, version: str, recipes_dir: Path) -> Recipe:
        """This package at ``version``: package-wide data with the version's own laid over it."""
        release = self.versions[version]
        patches = patches_dir(recipes_dir, self.name, version)
        return Recipe(
            name=self.name,
            version=version,
            distribution=self.distribution,
            local_version=release.local_version or self.local_version,
            description=self.description,
            source=release.source,
            build=self.build.model_copy(update={"requires": (*self.build.requires, *release.requires)}),
            env={**self.env, **release.env},
            targets=self.targets.model_copy(update={"supported": release.targets}) if release.targets else self.targets,
            depends_on=self.depends_on,
            repair=self.repair,
            smoke=self.smoke,
            preflight=self.preflight,
            patches=tuple(sorted(str(p.relative_to(recipes_dir)) for p in patches.glob("*.patch")))
            if patches.is_dir()
            else (),
        )


class Recipe(Model):
    """One package at one version: what the plan builds (made by :meth:`RecipeFile.at`)."""

    name: str
    version: str
    distribution: str | None = None
    local_version: str = "{line_label}"
    description: str = ""
    source: Source
    build: Build = Build()
    env: dict[str, str] = {}
    targets: Targets
    depends_on: tuple[str, ...] = ()
    repair: Repair = Repair()
    smoke: Smoke
    preflight: Preflight | None = None
    patches: tuple[str, ...] = ()  # relative to the recipes folder, applied in this order
    gpu_code: bool = True  # False when built by a targets.fallback that compiles no GPU code

    @property
    def dist_name(self) -> str:
        """The project name its wheels carry (normalized as in wheel file names)."""
        return canonicalize_name(self.distribution or self.name).replace("-", "_")


def _check_placeholders(text: str, where: str, allowed: tuple[str, ...] = tuple(PLACEHOLDERS)) -> None:
    prefix = f"{where}: " if where else ""
    for _, field, _, _ in string.Formatter().parse(text):
        if field is not None and field not in allowed:
            known = ", ".join("{" + p + "}" for p in allowed)
            raise ValueError(
                f"{prefix}unknown placeholder {{{field}}}; known: {known} (write {{{{ }}}} for a literal brace)"
            )


def recipe_path(recipes_dir: Path, name: str) -> Path:
    return recipes_dir / f"{name}.toml"


def patches_dir(recipes_dir: Path, name: str, version: str) -> Path:
    """Where a version's patches live: ``recipes/patches/<name>/<version>/*.patch``."""
    return recipes_dir / "patches" / name / version


def load_recipe(path: Path) -> RecipeFile:
    recipe = validate(RecipeFile, read_toml(path), path)
    if recipe.name != path.stem:
        raise ConfigError(
            path,
            "name",
            f"is {recipe.name!r} but the file is {path.name}",
            fix=f"rename the file to {recipe.name}.toml or set name = {path.stem!r}",
        )
    if not _NAME.match(recipe.name):
        raise ConfigError(path, "name", "use lowercase letters, digits and '-'")
    for version, release in recipe.versions.items():
        if release.source.path and not (path.parent / release.source.path).is_dir():
            raise ConfigError(
                path,
                f"versions.{version}.source.path",
                f"folder {path.parent / release.source.path} does not exist",
                fix="give a folder relative to the recipes folder, or create it",
            )
    return recipe


def load_recipes(recipes_dir: Path) -> dict[str, RecipeFile]:
    """Every ``*.toml`` in ``recipes_dir`` except the lock, by name; ``depends_on`` names must exist
    and form no cycle; no two recipes may make the same distribution."""
    recipes = {p.stem: load_recipe(p) for p in sorted(recipes_dir.glob("*.toml")) if p.name != LOCK_FILE}
    makers: dict[str, str] = {}
    for recipe in recipes.values():
        for dep in recipe.depends_on:
            if dep not in recipes:
                raise ConfigError(
                    recipe_path(recipes_dir, recipe.name),
                    "depends_on",
                    f"unknown recipe {dep!r}",
                    fix=f"known recipes: {', '.join(recipes)}",
                )
        other = makers.setdefault(recipe.dist_name, recipe.name)
        if other != recipe.name:
            raise ConfigError(
                recipe_path(recipes_dir, recipe.name),
                "distribution",
                f"makes {recipe.dist_name} wheels, as recipes/{other}.toml does",
                fix="one recipe per distribution: merge the two, or set another distribution",
            )
    _check_acyclic(recipes, recipes_dir)
    return recipes


def _check_acyclic(recipes: dict[str, RecipeFile], recipes_dir: Path) -> None:
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in path:
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise ConfigError(
                recipe_path(recipes_dir, name),
                "depends_on",
                f"dependency cycle: {cycle}",
                fix="remove one of these depends_on entries",
            )
        if name in done:
            return
        for dep in recipes[name].depends_on:
            visit(dep, (*path, name))
        done.add(name)

    for name in recipes:
        visit(name, ())
