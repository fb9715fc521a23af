"""The version lock (``recipes/lock.toml``): ROCm lines and the compatibility rules between packages.

A *line* pins one ROCm release: its builder image (by digest), Python versions, the GPU
targets its compiler accepts and the version of every recipe built for it. ``check_lock``
refuses a line whose versions break a rule, naming both sides and what is allowed.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from pydantic import AfterValidator, Field, field_validator, model_validator

from pipeline.config.models import Model, plain_name, read_toml, validate
from pipeline.config.recipes import LOCK_FILE, RecipeFile, recipe_path
from pipeline.config.targets import GpuTarget, known_processor_list, parse_targets
from pipeline.config.toolchain import ROCM_PATH, rocm_lib_dir
from pipeline.errors import ConfigError, RocwheelsError

log = logging.getLogger("rocwheels")

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
# Images rocwheels builds itself (``rocwheels image build``) carry a content hash in their tag
# instead of a registry digest.
_LOCAL_IMAGE = "localhost/"
UNVERIFIED = "unverified"


class RocmWheels(Model):
    """Where a ``wheels`` line's ROCm comes from: pip packages (AMD's TheRock) and their index."""

    # Installed into the builder (compiler, headers, CMake files: the devel extra).
    build: tuple[str, ...]
    # Declared in Requires-Dist of every wheel built on the line (the run-time libraries).
    requires: tuple[str, ...]
    index_url: str
    source: str

    @field_validator("build", "requires")
    @classmethod
    def _requirements(cls, requirements: tuple[str, ...]) -> tuple[str, ...]:
        if not requirements:
            raise ValueError('name at least one ROCm package, such as "rocm[libraries]==10.0.*"')
        for requirement in requirements:
            try:
                parsed = Requirement(requirement)
            except InvalidRequirement:
                raise ValueError(
                    f'{requirement!r} is not a pip requirement such as "rocm[libraries]==10.0.*"'
                ) from None
            if not parsed.specifier:
                raise ValueError(
                    f'{requirement!r} has no version: pin it, e.g. "{parsed.name}==10.0.*" (an unpinned ROCm moves under the wheels)'
                )
        return requirements

    @field_validator("index_url")
    @classmethod
    def _url(cls, url: str) -> str:
        if not re.match(r"^(https?|file)://[^\s]+$", url):
            raise ValueError(f"{url!r} is not an index URL (http://, https:// or file://)")
        return url


class Line(Model):
    rocm: str
    # "system": ROCm is installed on the machine (rocm_lib_dir); "wheels": it comes from pip
    # packages (rocm_wheels) that wheels of this line find through $ORIGIN-relative RPATHs.
    rocm_provider: Literal["system", "wheels"] = "system"
    rocm_wheels: RocmWheels | None = None
    builder_image: str
    image_source: str
    python: tuple[str, ...]
    targets: Annotated[tuple[str, ...], AfterValidator(known_processor_list)]
    targets_source: str = ""
    # The +local label of the line's wheels, where rocm<major>.<minor> would sort against another
    # line's ROCm release (PEP 440 compares "rocm10" and "rocm7" as text; recipes/README.md).
    label: str | None = None
    rocm_path: str = ROCM_PATH  # "" for a distribution's ROCm in the system folders
    rocm_lib_dir: str | None = None
    platform: str | None = None
    # Build environment this line's toolchain wants for every recipe (over the recipe's own env).
    env: dict[str, str] = {}
    # SOURCE_DATE_EPOCH of every build on the line and the time of every member of its wheels, so
    # that the same inputs give the same bytes (recipes/README.md); None: 1980-01-01, zip's first.
    source_date_epoch: Annotated[int, Field(ge=0)] | None = None
    versions: dict[str, str]

    @field_validator("rocm")
    @classmethod
    def _release(cls, rocm: str) -> str:
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", rocm):
            raise ValueError(f"{rocm!r} is not a ROCm release such as 6.2 or 6.2.4")
        return rocm

    @field_validator("label")
    @classmethod
    def _label(cls, label: str | None) -> str | None:
        if label is not None and not re.fullmatch(r"[a-z0-9]+(\.[a-z0-9]+)*", label):
            raise ValueError(
                f"{label!r} is not a PEP 440 local label: lower-case letters and digits in dot-separated parts, such as therock10.0"
            )
        return label

    @model_validator(mode="after")
    def _pinned(self) -> Line:
        # An unpinned registry image is tolerated only when the lock says so (the tool then warns,
        # and the container driver refuses it until it is pinned).
        if not (self.pinned or _is_unverified(self.image_source)):
            raise ValueError(
                f'builder_image: {self.builder_image!r} is not pinned: append @sha256:<64 hex digits> (a tag can move), or say image_source = "unverified: ..."'
            )
        if self.rocm_provider == "wheels" and self.rocm_wheels is None:
            raise ValueError(
                'rocm_wheels: rocm_provider = "wheels" needs a rocm_wheels table (build, requires, index_url, source)'
            )
        if self.rocm_provider == "system" and self.rocm_wheels is not None:
            raise ValueError(
                'rocm_provider: a rocm_wheels table is given but rocm_provider is "system": set rocm_provider = "wheels" or drop the table'
            )
        if self.rocm_provider == "wheels" and self.rocm_lib_dir is not None:
            raise ValueError(
                "rocm_lib_dir: a wheels line finds ROCm in its pip packages, not in a folder of the machine: remove rocm_lib_dir"
            )
        return self

    @property
    def pinned(self) -> bool:
        return bool(_DIGEST.search(self.builder_image)) or self.builder_image.startswith(_LOCAL_IMAGE)

    @field_validator("python")
    @classmethod
    def _pythons(cls, pythons: tuple[str, ...]) -> tuple[str, ...]:
        bad = [p for p in pythons if not re.fullmatch(r"3\.\d+", p)]
        if bad or not pythons:
            raise ValueError(f'Python versions are written like "3.11" (got {list(pythons)})')
        return pythons

    @property
    def local_version(self) -> str:
        """The PEP 440 local label wheels of this line carry: its ``label``, else ``rocm6.2`` for ROCm 6.2.x.

        PyTorch's scheme (``torch-2.5.1+rocm6.2`` on download.pytorch.org/whl/rocm6.2), which
        TheRock follows with the whole release (``+rocm7.0.0``: ROCm/TheRock
        build_tools/github_actions/determine_version.py). Both sort by release only while the
        major has one digit; ``check_lock`` refuses lines whose labels sort otherwise.
        """
        if self.label:
            return self.label
        major, minor = self.rocm.split(".")[:2]
        return f"rocm{major}.{minor}"

    @property
    def default_targets(self) -> tuple[GpuTarget, ...]:
        """What a build of this line is for when no ARCH is given: every target the line lists."""
        return parse_targets(";".join(self.targets))

    @property
    def lib_dir(self) -> str | None:
        """The machine's ROCm library folder; None when ROCm comes from pip packages."""
        if self.rocm_provider == "wheels":
            return None
        return self.rocm_lib_dir or rocm_lib_dir(self.rocm_path)


class Rule(Model):
    package: str
    versions: str
    requires: dict[str, str]
    source: str

    @field_validator("versions")
    @classmethod
    def _spec(cls, spec: str) -> str:
        _specifier(spec)
        return spec

    @field_validator("requires")
    @classmethod
    def _specs(cls, requires: dict[str, str]) -> dict[str, str]:
        for key, spec in requires.items():
            try:
                _specifier(spec)
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None
        return requires


class Signing(Model):
    """Who may sign provenance records: the public keys of the team's signing keys (pipeline/verify/signing.py).

    Several keys at once let a new key start signing before the old one is retired.
    """

    public_keys: tuple[str, ...] = ()

    @field_validator("public_keys")
    @classmethod
    def _keys(cls, keys: tuple[str, ...]) -> tuple[str, ...]:
        from pipeline.verify.signing import parse_public_key

        for number, key in enumerate(keys):
            try:
                parse_public_key(key)
            except ValueError as exc:
                raise ValueError(f"entry {number + 1}: {exc}") from None
        return keys


# The lock format this rocwheels reads; a newer file needs a newer rocwheels.
SCHEMA_VERSION = 1


class Lock(Model):
    schema_version: int = SCHEMA_VERSION
    default_line: str
    lines: dict[str, Line]
    rules: tuple[Rule, ...] = ()
    signing: Signing = Signing()

    @field_validator("schema_version")
    @classmethod
    def _known_schema(cls, schema: int) -> int:
        if schema != SCHEMA_VERSION:
            raise ValueError(
                f"this rocwheels reads lock schema {SCHEMA_VERSION}, not {schema}: upgrade rocwheels or write schema_version = {SCHEMA_VERSION}"
            )
        return schema

    @field_validator("lines")
    @classmethod
    def _line_names(cls, lines: dict[str, Line]) -> dict[str, Line]:
        # A line's name becomes file names (recipes/constraints/<line>.txt): never a path.
        for name in lines:
            plain_name(name, "lines: the line name")
        return lines


@dataclass(frozen=True)
class LockFile:
    path: Path
    lock: Lock

    def line(self, name: str) -> Line:
        if name not in self.lock.lines:
            raise ConfigError(
                self.path, "lines", f"no ROCm line named {name!r}", fix=f"use one of: {', '.join(self.lock.lines)}"
            )
        return self.lock.lines[name]


def rocm_values(line: Line) -> dict[str, str]:
    """The placeholders of recipes' local labels: ``rocm6.2`` (the line's label), ``7.2.1``, ``7.2``, ``721``, ``72``."""
    parts = line.rocm.split(".")
    return {
        "line_label": line.local_version,
        "rocm": line.rocm,
        "rocm_short": ".".join(parts[:2]),
        "rocm_digits": "".join(parts)[:3],
        "rocm_short_digits": "".join(parts[:2]),
    }


def _is_unverified(source: str) -> bool:
    return source.strip().lower().startswith(UNVERIFIED)


def _specifier(spec: str) -> SpecifierSet:
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier:
        raise ValueError(f'{spec!r} is not a version specifier such as "==2.5.*" or ">=6.1,<6.3"') from None


def load_lock(recipes_dir: Path) -> LockFile:
    path = recipes_dir / LOCK_FILE
    return LockFile(path, validate(Lock, read_toml(path), path))


def trusted_keys(recipes_dir: Path) -> tuple[str, ...] | None:
    """The public keys that may sign provenance records; None outside a project (no lock to ask)."""
    if not (recipes_dir / LOCK_FILE).is_file():
        return None
    return load_lock(recipes_dir).lock.signing.public_keys


def check_lock(lock_file: LockFile, recipes: dict[str, RecipeFile], *, warn_for: str | None = None) -> list[str]:
    """Raise ConfigError on the first inconsistency; return warnings about unverified pins
    (of every line, or only of line ``warn_for`` and the rules it uses)."""
    path, lock = lock_file.path, lock_file.lock
    if lock.default_line not in lock.lines:
        raise ConfigError(
            path, "default_line", f"{lock.default_line!r} is not a line", fix=f"use one of: {', '.join(lock.lines)}"
        )
    warnings = []
    used_rules: set[int] = set()
    for name, line in lock.lines.items():
        where = f"lines.{name}"
        _check_line_recipes(path, where, line, recipes)
        matched = _check_rules(path, where, line, lock.rules)
        if warn_for not in (None, name):
            continue
        used_rules.update(matched)
        if _is_unverified(line.image_source):
            pin = (
                ""
                if line.pinned
                else f"; not pinned by digest: the container driver refuses it until `rocwheels lock pin --rocm {name}` pins it"
            )
            warnings.append(f"{path}: {where}.builder_image is unverified ({line.image_source}){pin}")
        if _is_unverified(line.targets_source):
            warnings.append(f"{path}: {where}.targets is unverified ({line.targets_source})")
    _check_label_order(path, lock, recipes)
    for index, rule in enumerate(lock.rules):
        if index in used_rules and _is_unverified(rule.source):
            warnings.append(f"{path}: rules[{index}] ({rule.package} {rule.versions}) is unverified: {rule.source}")
    return warnings


def _check_line_recipes(path: Path, where: str, line: Line, recipes: dict[str, RecipeFile]) -> None:
    for package, version in line.versions.items():
        field = f"{where}.versions.{package}"
        recipe = recipes.get(package)
        if recipe is None:
            raise ConfigError(path, field, "no recipe of that name", fix=f"known recipes: {', '.join(recipes)}")
        if version not in recipe.versions:
            recipe_file = recipe_path(path.parent, package)
            raise ConfigError(
                path,
                field,
                f"{version} is not described in {recipe_file}",
                fix=f'add [versions."{version}"] with its source to {recipe_file}, or pin one of: {", ".join(recipe.versions)}',
            )
        for dep in recipe.depends_on:
            if dep not in line.versions:
                raise ConfigError(
                    path,
                    field,
                    f"{package} depends on {dep}, which this line does not pin",
                    fix=f"add {dep} to [{where}.versions]",
                )


def _check_label_order(path: Path, lock: Lock, recipes: dict[str, RecipeFile]) -> None:
    """Builds of one version on two lines must sort as their ROCm releases do: an install that does
    not pin the label takes the highest, and two lines must never name different builds alike."""
    builds: dict[tuple[str, str], list[tuple[str, Line, str]]] = {}
    for name, line in lock.lines.items():
        for package, version in line.versions.items():
            builds.setdefault((package, version), []).append((name, line, _label_template(recipes[package], version)))
    for (package, version), found in builds.items():
        template = found[0][2]
        labelled = [(name, line, template.format_map(rocm_values(line))) for name, line, _ in found]
        for older, newer in itertools.combinations(sorted(labelled, key=lambda build: Version(build[1].rocm)), 2):
            (old_name, old_line, old_label), (new_name, new_line, new_label) = older, newer
            if Version(old_line.rocm) == Version(new_line.rocm) or Version(f"{version}+{old_label}") < Version(
                f"{version}+{new_label}"
            ):
                continue
            recipe = recipes[package]
            own = recipe.versions[version].local_version is not None
            where, field = (
                (path, f"lines.{new_name}.label")
                if template == "{line_label}"
                else (
                    recipe_path(path.parent, package),
                    f"versions.{version}.local_version" if own else "local_version",
                )
            )
            raise ConfigError(
                where,
                field,
                f"{package} {version}+{new_label} (lines.{new_name}, ROCm {new_line.rocm}) sorts "
                + ("the same as" if old_label == new_label else "below")
                + f" {package} {version}+{old_label} (lines.{old_name}, ROCm {old_line.rocm}): an unpinned install "
                "would take the older ROCm's build (PEP 440 compares a label's parts that hold letters as text: "
                "rocm10.0 < rocm7.2)",
                fix=(
                    f"give lines.{new_name} a label that sorts above +{old_label}"
                    if template == "{line_label}"
                    else f"make {package}'s build take the line's label: local_version = \"{{line_label}}\" and the "
                    "package's version override in [env]"
                )
                + " (recipes/README.md, Local labels)",
            )


def _label_template(recipe: RecipeFile, version: str) -> str:
    return recipe.versions[version].local_version or recipe.local_version


def _check_rules(path: Path, where: str, line: Line, rules: tuple[Rule, ...]) -> set[int]:
    """Check ``line`` against every rule; return the indices of the rules that apply to it."""
    pinned = {**line.versions, "rocm": line.rocm}
    applied: set[int] = set()
    for package, version in line.versions.items():
        own_rules = [r for r in rules if r.package == package]
        if not own_rules:
            continue  # a package no rule mentions (the canary) goes with any line
        matching = [r for r in own_rules if Version(version) in SpecifierSet(r.versions)]
        applied.update(rules.index(r) for r in matching)
        if not matching:
            known = "; ".join(r.versions for r in own_rules)
            raise ConfigError(
                path,
                f"{where}.versions.{package}",
                f"no compatibility rule covers {package} {version}",
                fix=f"pin a version the rules know ({known}) or add a rule with its source",
            )
        for rule in matching:
            for other, spec in rule.requires.items():
                other_field = f"{where}.rocm" if other == "rocm" else f"{where}.versions.{other}"
                have = pinned.get(other)
                if have is None:
                    raise ConfigError(
                        path,
                        f"{where}.versions",
                        f"{package} {version} requires {other} {spec}, which this line does not pin",
                        fix=f"add {other} to the line",
                    )
                if Version(have) not in SpecifierSet(spec):
                    raise ConfigError(
                        path,
                        f"{where}.versions.{package}",
                        f"{package} {version} requires {other} {spec}, but {other_field} = {have}",
                        fix=f"allowed {other} for {package} {rule.versions}: {spec} (source: {rule.source})",
                    )
    return applied


def same_release(rocm: str, other: str) -> bool:
    """Two ROCm versions of one release (major.minor): a line's 7.2.1 and a host's 7.2."""
    return Version(rocm).release[:2] == Version(other).release[:2]


def line_for_release(lock_file: LockFile, rocm: str) -> tuple[str, Line] | None:
    """The first line of ``rocm``'s release, if the lock has one."""
    return next(((name, line) for name, line in lock_file.lock.lines.items() if same_release(line.rocm, rocm)), None)


def select_line(lock_file: LockFile, name: str | None, host_rocm: str | None = None) -> tuple[str, Line]:
    """The line to build for: ``name``, else the one matching the host's ROCm, else the default."""
    if name:
        return name, lock_file.line(name)
    if host_rocm is not None:
        found = line_for_release(lock_file, host_rocm)
        if found is not None:
            return found
        raise RocwheelsError(
            f"no line in {lock_file.path} is for this host's ROCm {host_rocm}",
            fix=f'add a line with rocm = "{host_rocm}", or build in the container (DRIVER=container ROCM=<line>); lines: '
            + ", ".join(f"{line_name} (ROCm {line.rocm})" for line_name, line in lock_file.lock.lines.items()),
        )
    return lock_file.lock.default_line, lock_file.line(lock_file.lock.default_line)
