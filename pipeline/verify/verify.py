"""Verify stage: prove what is inside a repaired wheel before it may be published.

Checks, per wheel: (a) no ROCm library inside; (b) every needed library resolves in the target
layout, and none would be loaded twice; (c) GPU code objects for exactly the requested targets;
(d) no empty or build-machine RPATH entry; (e) one platform tag, the lock line's, that the
contents allow (auditwheel's policy analysis), and the ``+rocm`` local version; (f) exact
Requires-Dist pins on the builds it links against; (g) a variant wheel's ``amd :: gfx_arch``
properties are the GPUs its code objects run on; (h) a smoke test in a fresh venv.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from pipeline.config.recipes import Smoke
from pipeline.config.rocm_wheels import loaded_from_packages_check
from pipeline.config.targets import runs_on
from pipeline.repair.pins import missing_pins
from pipeline.verify.provenance import check_record, check_record_signature
from pipeline.verify.smoke import smoke_test
from pipeline.wheel.analyze import (
    DEFAULT_LIBRARY_DIRS,
    MUSL_LIBRARY_DIRS,
    Kind,
    TargetLayout,
    WheelAnalysis,
    analyze_wheel,
    expand_origin,
)
from pipeline.wheel.archive import open_wheel, parse_wheel_name, split_variant
from pipeline.wheel.platform_tag import check_platform_tag
from pipeline.wheel.variant import FEATURE, NAMESPACE, read_variant, served_processors

ERROR, WARNING = "error", "warning"
# auditwheel's name for a grafted copy: libfoo-<8 hex>.so.1
_GRAFTED = re.compile(r"^(?P<base>.+)-[0-9a-f]{8}(?P<ext>\.so.*)$")


@dataclass(frozen=True)
class Expectations:
    """What a wheel must be: from the recipe, the lock line and the requested targets."""

    layout: TargetLayout = field(default_factory=TargetLayout)
    targets: tuple[str, ...] | None = None  # GPU processors; None: report, do not judge
    version: str | None = None  # the exact version, 2.5.1+rocm6.2
    platform: str | None = None  # the lock line's platform tag, manylinux_2_28_x86_64
    extra_rpath: tuple[str, ...] = ()
    smoke: Smoke | None = None
    # depends_on pins (torch==2.5.1+rocm6.2) the smoke test installs too, from find_links
    smoke_requirements: tuple[str, ...] = ()
    find_links: Path | None = None
    # exact requirements the wheel must carry: the builds it links against (torch==2.14.1+rocm7.2)
    pins: tuple[str, ...] = ()
    index_urls: tuple[str, ...] = ()  # a `wheels` line's ROCm index, for the smoke test


@dataclass(frozen=True)
class Finding:
    level: str
    check: str
    message: str
    file: str | None = None


@dataclass(frozen=True)
class Report:
    wheel: Path
    findings: tuple[Finding, ...]
    gpu_targets: dict[str, tuple[str, ...]]  # ELF member -> processors

    @property
    def ok(self) -> bool:
        return not any(f.level == ERROR for f in self.findings)

    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.level == ERROR]

    def to_dict(self) -> dict[str, Any]:
        return {
            "wheel": str(self.wheel),
            "ok": self.ok,
            "gpu_targets": self.gpu_targets,
            "findings": [asdict(f) for f in self.findings],
        }


def verify_wheel(
    wheel: Path,
    expect: Expectations,
    *,
    smoke: bool = True,
    log_file: Path | None = None,
    scratch: Path | None = None,
    trusted_keys: tuple[str, ...] | None = None,
    sha256: str | None = None,
) -> Report:
    """``trusted_keys``: the lock's signing keys, for the record beside the wheel (None: outside a project);
    ``sha256``: the wheel's, where the caller has just hashed it (multi-GB wheels are not read twice)."""
    analysis = analyze_wheel(wheel, expect.layout)
    findings = [
        *_rocm_inside(analysis),
        *_resolution(analysis),
        *_gpu_targets(analysis, expect.targets),
        *_search_paths(analysis, expect),
        *_tags_and_version(analysis, expect.version, expect.platform),
        *_platform_allowed(analysis),
        *_pinned_requirements(analysis, expect.pins),
        *variant_findings(wheel, _code_targets(analysis)),
        *_provenance(wheel, trusted_keys, sha256),
    ]
    if smoke and expect.smoke is not None:
        if any(f.level == ERROR for f in findings):
            findings.append(Finding(WARNING, "smoke", "not run: the wheel has errors"))
        else:
            result = smoke_test(
                wheel,
                expect.smoke,
                requirements=expect.smoke_requirements,
                find_links=expect.find_links,
                index_urls=expect.index_urls,
                checks=_rocm_packages_check(analysis, expect.smoke),
                code_targets=list(_code_targets(analysis).values()) or None,
                log_file=log_file,
                scratch=scratch,
            )
            findings.append(
                Finding(WARNING if result.skipped else ERROR if not result.passed else "ok", "smoke", result.message)
            )
    return Report(wheel, tuple(findings), _code_targets(analysis))


def _code_targets(analysis: WheelAnalysis) -> dict[str, tuple[str, ...]]:
    return {m.name: m.gpu_targets for m in analysis.members if m.gpu_targets}


def variant_findings(wheel: Path, code_targets: dict[str, tuple[str, ...]]) -> list[Finding]:
    """A variant wheel must say what it is: the label of its file name is its variant.json's, and
    its ``amd :: gfx_arch`` values are exactly the GPUs its code objects (``code_targets``: member ->
    targets) run on, or the provider would hand it to a GPU it has no code for."""
    label = split_variant(wheel.name)[1]
    found = read_variant(wheel)
    if found is None:
        if label is None:
            return []
        return [Finding(ERROR, "variant", f"variant label {label} in the file name, but no variant.json")]
    if found.label != label:
        return [Finding(ERROR, "variant", f"variant.json is for label {found.label}, the file name says {label}")]
    others = sorted(" :: ".join(p) for p in found.properties if (p[0], p[1]) != (NAMESPACE, FEATURE))
    served = served_processors(t for targets in code_targets.values() for t in targets)
    findings = []
    if others:
        findings.append(Finding(ERROR, "variant", f"properties rocwheels does not publish: {', '.join(others)}"))
    if set(found.processors) != set(served):
        findings.append(
            Finding(
                ERROR,
                "variant",
                f"{NAMESPACE} :: {FEATURE} says {', '.join(found.processors) or 'nothing'}, "
                f"the code objects run on {', '.join(served) or 'no GPU'}",
            )
        )
    return findings or [Finding("ok", "variant", f"{label}: {NAMESPACE} :: {FEATURE} :: {', '.join(served)}")]


def _rocm_packages_check(analysis: WheelAnalysis, smoke: Smoke) -> tuple[str, ...]:
    """With ROCm from pip packages: the installed venv must hold and load every ROCm library needed."""
    if analysis.layout.rocm_lib_dir is not None:
        return ()
    sonames = [d.soname for m in analysis.members for d in m.dependencies if d.kind == Kind.ROCM]
    return (loaded_from_packages_check(sonames, smoke.imports),) if sonames else ()


def _provenance(wheel: Path, trusted_keys: tuple[str, ...] | None, sha256: str | None) -> list[Finding]:
    """A wheel with a provenance record beside it must still be the file that record describes,
    and the record what a trusted key signed."""
    ok, message = check_record(wheel, sha256)
    findings = [Finding("ok" if ok else ERROR, "provenance", message)]
    signature = check_record_signature(wheel, trusted_keys)
    if signature is not None:
        findings.append(Finding(signature[0], "signature", signature[1]))
    return findings


def _rocm_inside(analysis: WheelAnalysis) -> list[Finding]:
    policy = analysis.layout.policy
    return [
        Finding(
            ERROR,
            "rocm-inside",
            f"ROCm library {m.install_path} is inside the wheel: next to the host's ROCm it makes two copies in one process "
            "(exclude it at repair; rocwheels' ROCm list is pipeline/data/rocm-libraries.toml)",
            m.name,
        )
        for m in analysis.members
        if policy.is_rocm(posixpath.basename(m.install_path)) or (m.soname and policy.is_rocm(m.soname))
    ]


def _resolution(analysis: WheelAnalysis) -> list[Finding]:
    findings = [
        Finding(ERROR, "unresolved", f"needs {dep.soname}, which would not load: {dep.note}", m.name)
        for m in analysis.members
        for dep in m.dependencies
        if dep.location is None
    ]
    providers: dict[str, list[str]] = defaultdict(list)
    for m in analysis.members:
        name = m.soname or posixpath.basename(m.install_path)
        grafted = _GRAFTED.match(name)
        providers[grafted["base"] + grafted["ext"] if grafted else name].append(m.install_path)
    for library, paths in sorted(providers.items()):
        if len(paths) > 1 and library.startswith("lib"):
            findings.append(
                Finding(
                    ERROR,
                    "loaded-twice",
                    f"{library} is in the wheel {len(paths)} times ({', '.join(paths)}): two copies would be loaded",
                )
            )
    return findings


def _gpu_targets(analysis: WheelAnalysis, requested: tuple[str, ...] | None) -> list[Finding]:
    findings = []
    with_code = [m for m in analysis.members if m.gpu_targets or m.fatbin_error]
    for m in with_code:
        if m.fatbin_error:
            findings.append(Finding(ERROR, "gpu-targets", f"unreadable .hip_fatbin: {m.fatbin_error}", m.name))
            continue
        if requested is None:
            continue
        # A generic code object (gfx11-generic) serves every processor it lists.
        missing = sorted(p for p in set(requested) if not any(runs_on(t, p) for t in m.gpu_targets))
        extra = sorted(t for t in set(m.gpu_targets) if not any(runs_on(t, p) for p in requested))
        if missing:
            findings.append(
                Finding(
                    ERROR,
                    "gpu-targets",
                    f"no code objects for {', '.join(missing)} (has {', '.join(m.gpu_targets)})",
                    m.name,
                )
            )
        if extra:
            findings.append(
                Finding(WARNING, "gpu-targets", f"code objects for unrequested {', '.join(extra)} (size only)", m.name)
            )
    links_hip = any(d.kind == Kind.ROCM for m in analysis.members for d in m.dependencies)
    if not with_code and links_hip and requested:
        findings.append(
            Finding(
                WARNING, "gpu-targets", "links the ROCm runtime but carries no GPU code objects (a JIT-only package?)"
            )
        )
    return findings


def _search_paths(analysis: WheelAnalysis, expect: Expectations) -> list[Finding]:
    allowed = {expect.layout.rocm_lib_dir, *expect.extra_rpath, *DEFAULT_LIBRARY_DIRS, *MUSL_LIBRARY_DIRS}
    findings = []
    for m in analysis.members:
        for entry in m.search_path:
            if entry == "":
                findings.append(
                    Finding(ERROR, "rpath", "empty RPATH entry: the loader reads it as the current directory", m.name)
                )
            elif "$ORIGIN" in entry or "${ORIGIN}" in entry:
                if expand_origin(entry, posixpath.dirname(m.install_path)).startswith(".."):
                    findings.append(Finding(ERROR, "rpath", f"RPATH entry {entry} leaves site-packages", m.name))
            elif entry not in allowed:
                findings.append(Finding(ERROR, "rpath", f"RPATH entry {entry} is a path of the build machine", m.name))
    return findings


def _tags_and_version(
    analysis: WheelAnalysis, expected_version: str | None, expected_platform: str | None
) -> list[Finding]:
    info = analysis.info
    findings = []
    platforms = info.platform_tags
    if len(platforms) != 1:
        findings.append(
            Finding(ERROR, "tags", f"{len(platforms)} platform tags in the file name ({'.'.join(platforms)}): keep one")
        )
    elif expected_platform and platforms not in ((expected_platform,), ("any",)):  # a pure wheel runs on any platform
        findings.append(
            Finding(ERROR, "tags", f"platform tag {platforms[0]}, but the lock line says {expected_platform}")
        )
    if any(p.startswith("linux_") for p in platforms) and analysis.members:
        findings.append(Finding(ERROR, "tags", "platform tag linux_*: the wheel was not repaired (rocwheels repair)"))
    name_tags = {str(t) for t in parse_wheel_name(info.path.name)[3]}
    if name_tags != set(info.tags):
        findings.append(
            Finding(
                ERROR, "tags", f"WHEEL Tag lines {sorted(info.tags)} differ from the file name's {sorted(name_tags)}"
            )
        )
    version = Version(info.version)
    if not (version.local or "").startswith("rocm"):
        findings.append(Finding(ERROR, "version", f"version {info.version} has no +rocm local label"))
    elif expected_version is not None and version != Version(expected_version):
        findings.append(
            Finding(ERROR, "version", f"version {info.version}, but the lock line expects {expected_version}")
        )
    return findings


def _platform_allowed(analysis: WheelAnalysis) -> list[Finding]:
    """Each platform tag must be one the contents allow (auditwheel's symbol-version analysis)."""
    versions = [pair for m in analysis.members for pair in m.symbol_versions]
    findings = []
    for tag in analysis.info.platform_tags:
        if tag.startswith("linux_") or tag == "any":
            continue  # linux_: no promise beyond the build machine, flagged above; any: pure Python (Triton flash-attention)
        allowed = check_platform_tag(versions, tag)
        if allowed.problem:
            findings.append(Finding(ERROR, "tags", f"platform tag {tag}: {allowed.problem}"))
    return findings


def _pinned_requirements(analysis: WheelAnalysis, pins: tuple[str, ...]) -> list[Finding]:
    """An extension must require exactly the builds it links against, or pip may pair it with another torch."""
    if not pins:
        return []
    with open_wheel(analysis.info.path) as archive:
        metadata = archive.read(f"{analysis.info.dist_info}/METADATA").decode("utf-8")
    return [
        Finding(
            ERROR,
            "requires",
            f"Requires-Dist does not pin {pin}: pip could install it next to another build (repair writes the pins)",
        )
        for pin in missing_pins(metadata, pins)
    ]


def format_report(report: Report) -> str:
    status = "OK" if report.ok else "FAILED"
    lines = [f"{report.wheel.name}: {status}"]
    for member, targets in report.gpu_targets.items():
        lines.append(f"  gpu targets {', '.join(targets)}  {member}")
    for finding in report.findings:
        where = f" [{finding.file}]" if finding.file else ""
        lines.append(f"  {finding.level}: {finding.check}: {finding.message}{where}")
    return "\n".join(lines)


def reports_json(reports: Sequence[Report]) -> str:
    return json.dumps([r.to_dict() for r in reports], indent=2)
