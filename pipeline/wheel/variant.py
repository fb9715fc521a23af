"""PEP 825 variant wheels: the GPU targets a wheel was built for, in its file name and its metadata.

A variant wheel is the verified wheel plus ``*.dist-info/variant.json`` naming its properties
(``amd :: gfx_arch :: gfx942``), with a variant label appended to its file name
(``...-manylinux_2_28_x86_64-gfx942.whl``). The properties are the ones AMD's provider plugin
reports for a GPU (``rocm-bootstrap``'s ``AMDVariantPlugin``), so an installer that runs that
provider picks the build for the GPU it finds. The format is variantlib's: variant.json and the
index's ``{name}-{version}-variants.json`` are made and merged by its API, not by hand.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from variantlib.api import VariantDescription, VariantProperty, make_variant_dist_info
from variantlib.constants import VARIANT_DIST_INFO_FILENAME
from variantlib.errors import ValidationError
from variantlib.models.variant_info import ProviderInfo, VariantInfo
from variantlib.variant_dist_info import VariantDistInfo
from variantlib.variants_json import VariantsJson

from pipeline.config.gpu_processors import gpu_processors
from pipeline.errors import RocwheelsError
from pipeline.wheel.archive import check_wheel, open_wheel, rewrite_wheel
from pipeline.wheel.zipwrite import Added

NAMESPACE = "amd"
FEATURE = "gfx_arch"
# AMD's provider (rocm-bootstrap on PyPI): what an installer runs to learn this machine's GPUs.
PROVIDER = ProviderInfo(
    requires=["rocm-bootstrap>=0.3,<0.4"], plugin_api="rocm_bootstrap.variant_provider:AMDVariantPlugin"
)
# PEP 825: a label is at most 16 characters of [0-9a-z_.]; "null" is the variant without properties.
MAX_LABEL = 16
_LABEL = re.compile(r"[0-9a-z_.]{1,16}")


@dataclass(frozen=True)
class WheelVariant:
    """A build's place among a line's builds: its variant label and the GPU processors it serves."""

    label: str  # gfx942, gfx90a_gfx942, or t<hash> when the names are too long
    processors: tuple[str, ...]  # the amd :: gfx_arch values, sorted
    plain: bool  # also published without a label: the build pip and installers without variants get

    def filename(self, plain_name: str) -> str:
        """``plain_name`` (a wheel file name) with this variant's label."""
        return f"{plain_name.removesuffix('.whl')}-{self.label}.whl"


def served_processors(code_targets: Iterable[str]) -> tuple[str, ...]:
    """The processors code for ``code_targets`` runs on, sorted: a generic target (gfx11-generic)
    stands for its members, which is what a GPU's provider reports (values allow no ``-``)."""
    table = gpu_processors().by_name
    served: set[str] = set()
    for target in code_targets:
        entry = table.get(target)
        served.update(entry.serves if entry is not None and entry.serves else (target,))
    return tuple(sorted(served))


def variant_label(processors: Iterable[str]) -> str:
    """The stable label of a set of processors: their names joined (``gfx90a_gfx942``) while that
    fits in 16 characters, else ``t`` and 15 hex digits of their hash. Order does not matter."""
    names = sorted(set(processors))
    joined = "_".join(names)
    if len(joined) <= MAX_LABEL:
        return joined
    return "t" + hashlib.sha256(joined.encode()).hexdigest()[: MAX_LABEL - 1]


def make_variant(wheel: Path, dest_dir: Path, variant: WheelVariant) -> Path:
    """``wheel`` (a verified wheel) written into ``dest_dir`` as ``variant``'s variant wheel:
    variant.json added to its dist-info (RECORD follows), the label appended to its name."""
    if not _LABEL.fullmatch(variant.label) or variant.label == "null":
        raise RocwheelsError(
            f"variant label {variant.label!r} is not a PEP 825 label",
            fix="labels are 1 to 16 characters of 0-9 a-z _ . (pipeline/wheel/variant.py variant_label)",
        )
    dist_info = check_wheel(wheel, verify_hashes=False).dist_info
    return rewrite_wheel(
        wheel,
        dest_dir / variant.filename(wheel.name),
        added={f"{dist_info}/{VARIANT_DIST_INFO_FILENAME}": Added(variant_json(variant).encode("utf-8"))},
    )


def variant_json(variant: WheelVariant) -> str:
    """The ``variant.json`` of ``variant`` (variantlib writes it)."""
    description = VariantDescription(
        [VariantProperty(NAMESPACE, FEATURE, processor) for processor in variant.processors], label=variant.label
    )
    info = VariantInfo(namespace_priorities=[NAMESPACE], providers={NAMESPACE: PROVIDER})
    # No plugin is loaded here: amd is an install-time provider, its properties are checked by verify.
    return str(make_variant_dist_info(description, variant_info=info))


@dataclass(frozen=True)
class ReadVariant:
    """What a variant wheel says about itself."""

    label: str
    properties: tuple[tuple[str, str, str], ...]  # (namespace, feature, value)
    dist_info: VariantDistInfo

    @property
    def processors(self) -> tuple[str, ...]:
        return tuple(sorted(value for ns, feature, value in self.properties if (ns, feature) == (NAMESPACE, FEATURE)))


def read_variant(wheel: Path) -> ReadVariant | None:
    """The variant.json of ``wheel``; None for a wheel without one."""
    dist_info = check_wheel(wheel, verify_hashes=False).dist_info
    member = f"{dist_info}/{VARIANT_DIST_INFO_FILENAME}"
    with open_wheel(wheel) as archive:
        if member not in archive.namelist():
            return None
        data = archive.read(member)
    try:
        parsed = VariantDistInfo(data)
    except (ValidationError, ValueError, TypeError) as exc:
        raise RocwheelsError(
            f"{wheel}: {member} is not a PEP 825 variant.json ({exc})",
            fix="make the variant again from the verified wheel (rocwheels wheels ... --force)",
        ) from None
    properties = tuple((p.namespace, p.feature, p.value) for p in parsed.variant_desc.properties)
    return ReadVariant(parsed.variant_label, properties, parsed)


def variants_json_name(project: str, version: str) -> str:
    """``{name}-{version}-variants.json``, the name PEP 825 gives the index file of one release."""
    return f"{project.replace('-', '_')}-{version}-variants.json"


def merge_variants_json(wheels: Iterable[Path]) -> str:
    """The ``*-variants.json`` of one release: every variant wheel's variant.json merged (variantlib),
    so installers learn every label and its properties from one file."""
    merged: VariantsJson | None = None
    for wheel in wheels:
        found = read_variant(wheel)
        if found is None:
            continue
        if merged is None:
            merged = VariantsJson(found.dist_info)
        try:
            merged.merge(found.dist_info)
        except ValidationError as exc:
            raise RocwheelsError(
                f"{wheel.name}: its variant.json disagrees with another variant of the release ({exc})",
                fix="one label must always mean one set of GPU targets: rebuild the older variant",
            ) from None
    if merged is None:
        raise ValueError("no variant wheels to merge")
    return json.dumps(json.loads(merged.to_str()), indent=2, sort_keys=True) + "\n"
