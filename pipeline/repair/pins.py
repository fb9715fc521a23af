"""Pin an extension's ``Requires-Dist`` to the exact builds it was linked against.

A wheel built against ``torch==2.14.1+rocm7.2`` loads that torch's ``libtorch*.so`` and only
works with it (C++ ABI, kernel registry). Upstream metadata says ``torch`` or ``torch>=2.x``, so
``pip install --extra-index-url URL flash-attn`` would happily take the highest torch of any
index (PyPI's CUDA build). An exact pin with the local label leaves pip one choice: PEP 440
matches ``==2.14.1+rocm7.2`` against that local label, where ``==2.14.1`` would ignore it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import NormalizedName, canonicalize_name

from pipeline.config.recipes import Recipe
from pipeline.errors import RocwheelsError
from pipeline.wheel.archive import check_wheel, open_wheel, rewrite_wheel

_FIELD = "Requires-Dist"


def linked_builds(recipe: Recipe, dependencies: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """What ``recipe``'s wheels must require exactly (``torch==2.14.1+rocm7.2``): the line's builds
    of its depends_on recipes (``dependencies``: distribution, version) and its build wheels."""
    return tuple(
        f"{name}=={version}" for name, version in (*dependencies, *(wheel.pin for wheel in recipe.build.wheels))
    )


def pin_requirements(metadata: str, pins: Iterable[str]) -> str:
    """``metadata`` (a METADATA file's text) with every ``Requires-Dist`` on the project of a pin
    (``torch==2.14.1+rocm7.2``) pinned to that version; markers and extras stay. A pinned project
    the metadata does not require unconditionally is added: the wheel links it."""
    wanted = {canonicalize_name(name): version for name, version in map(_exact, pins)}
    header, separator, body = _split(metadata)
    unconditional: set[str] = set()
    out = []
    for line in header.split("\n"):
        requirement = _requirement(line)
        name = canonicalize_name(requirement.name) if requirement else None
        if requirement is None or name not in wanted:
            out.append(line)
            continue
        requirement.specifier = SpecifierSet(f"=={wanted[name]}")
        if requirement.marker is None:
            unconditional.add(name)
        out.append(f"{_FIELD}: {requirement}")
    # An added pin keeps its extras (a `wheels` line's rocm[libraries]==10.0.0).
    extras = {
        canonicalize_name(r.name): f"[{','.join(sorted(r.extras))}]" if r.extras else "" for r in map(Requirement, pins)
    }
    missing = [
        f"{_FIELD}: {name}{extras[name]}=={version}" for name, version in wanted.items() if name not in unconditional
    ]
    # New fields go after the existing Requires-Dist lines (or at the end of the header).
    last = max((i for i, line in enumerate(out) if line.startswith(f"{_FIELD}:")), default=len(out) - 1)
    out[last + 1 : last + 1] = missing
    return "\n".join(out) + separator + body


def missing_pins(metadata: str, pins: Iterable[str]) -> list[str]:
    """The pins (``torch==2.14.1+rocm7.2``) that ``metadata`` does not require exactly and unconditionally."""
    exact = exact_requirements(metadata)
    return [pin for pin in pins if exact.get(canonicalize_name(_exact(pin)[0])) != _exact(pin)[1]]


def pin_wheel(wheel: Path, dest_dir: Path, pins: Iterable[str]) -> Path:
    """``wheel`` written into ``dest_dir`` (same name) with its METADATA pinned; RECORD follows."""
    member = f"{check_wheel(wheel).dist_info}/METADATA"
    with open_wheel(wheel) as archive:
        metadata = archive.read(member).decode("utf-8")
    return rewrite_wheel(
        wheel, dest_dir / wheel.name, replace={member: pin_requirements(metadata, pins).encode("utf-8")}
    )


def exact_requirements(metadata: str) -> dict[NormalizedName, str]:
    """The unconditional ``name==version`` requirements of ``metadata``, by canonical name."""
    exact: dict[NormalizedName, str] = {}
    for line in _split(metadata)[0].split("\n"):
        requirement = _requirement(line)
        if requirement is None or requirement.marker is not None:
            continue
        specs = list(requirement.specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            exact[canonicalize_name(requirement.name)] = specs[0].version
    return exact


def _split(metadata: str) -> tuple[str, str, str]:
    """Header fields, the blank line, and the description body (which may hold anything)."""
    header, separator, body = metadata.partition("\n\n")
    return header.rstrip("\n"), "\n\n" if separator else "\n", body


def _exact(pin: str) -> tuple[str, str]:
    """(project, version) of ``name==version``."""
    requirement = Requirement(pin)
    specs = list(requirement.specifier)
    if len(specs) != 1 or specs[0].operator != "==" or requirement.marker is not None:
        raise RocwheelsError(
            f"{pin!r} is not an exact pin", fix="write it as name==version, e.g. torch==2.14.1+rocm7.2"
        )
    return requirement.name, specs[0].version


def _requirement(line: str) -> Requirement | None:
    if not line.startswith(f"{_FIELD}:"):
        return None
    text = line.split(":", 1)[1].strip()
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise RocwheelsError(
            f"METADATA has an invalid {_FIELD}: {text!r} ({exc})",
            fix="fix the package's declared dependencies and rebuild",
        ) from None
