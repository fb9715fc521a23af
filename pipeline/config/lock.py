"""The version lock (``recipes/lock.toml``): ROCm lines and the compatibility rules between packages.

A *line* pins one ROCm release: its builder image (by digest), Python versions, the GPU
targets its compiler accepts and the version of every recipe built for it. ``check_lock``
refuses a line whose versions break a rule, naming both sides and what is allowed.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version
from pydantic import AfterValidator, field_validator, model_validator

from pipeline.config.models import Model, read_toml, validate
from pipeline.config.recipes import LOCK_FILE, RecipeFile, recipe_path
from pipeline.config.targets import known_processor_list
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
    rocm_path: str = "/opt/rocm"  # "" for a distribution's ROCm in the system folders
    rocm_lib_dir: str | None = None
    platform: str | None = None
    # Build environment this line's toolchain wants for every recipe (over the recipe's own env).
    env: dict[str, str] = {}
    versions: dict[str, str]

    @field_validator("rocm")
    @classmethod
    def _release(cls, rocm: str) -> str:
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", rocm):
            raise ValueError(f"{rocm!r} is not a ROCm release such as 6.2 or 6.2.4")
        return rocm

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
        """The PEP 440 local label wheels of this line carry: ``rocm6.2``."""
        major, minor = self.rocm.split(".")[:2]
        return f"rocm{major}.{minor}"

    @property
    def lib_dir(self) -> str | None:
        """The machine's ROCm library folder; None when ROCm comes from pip packages."""
        if self.rocm_provider == "wheels":
            return None
        return self.rocm_lib_dir or f"{self.rocm_path.rstrip('/') or '/usr'}/lib"


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


def select_line(lock_file: LockFile, name: str | None, host_rocm: str | None = None) -> tuple[str, Line]:
    """The line to build for: ``name``, else the one matching the host's ROCm, else the default."""
    if name:
        return name, lock_file.line(name)
    if host_rocm is not None:
        host = Version(host_rocm).release[:2]
        for line_name, line in lock_file.lock.lines.items():
            if Version(line.rocm).release[:2] == host:
                return line_name, line
        raise RocwheelsError(
            f"no line in {lock_file.path} is for this host's ROCm {host_rocm}",
            fix=f'add a line with rocm = "{host_rocm}", or build in the container (DRIVER=container ROCM=<line>); lines: '
            + ", ".join(f"{n} (ROCm {l.rocm})" for n, l in lock_file.lock.lines.items()),
        )
    return lock_file.lock.default_line, lock_file.line(lock_file.lock.default_line)
