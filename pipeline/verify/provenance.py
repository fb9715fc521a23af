"""Provenance: what made each accepted wheel, so a stale wheel is never called up to date.

Every recipe of a plan gets a *fingerprint*: a sha256 over everything that decides its wheel's
content (the recipe at its version, the patches' and a local source folder's bytes, the lock
line, the GPU targets, the driver, the build-environment constraints, rocwheels' version) and
over the fingerprints of the recipes it depends on, so a change reaches every dependant and
nothing else. Each wheel accepted into the wheelhouse gets ``<wheel>.provenance.json`` beside it:
that fingerprint, the inputs in readable form, the toolchain and the wheel's own sha256, signed
when rocwheels is given a signing key (pipeline/verify/signing.py: what a team's index must
carry for a record to be believed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pipeline import rocwheels_version
from pipeline.build.sources import IGNORED_NAMES
from pipeline.errors import RocwheelsError
from pipeline.util.files import atomic_write, file_sha256
from pipeline.verify.signing import SignatureCheck, SigningKey, Trust, check_signature

if TYPE_CHECKING:
    from pipeline.description import BuildDescription
    from pipeline.plan import Plan

SUFFIX = ".provenance.json"
# Bumped when the record's meaning changes: an older record then no longer matches.
RECORD_FORMAT = 1


@dataclass(frozen=True)
class Provenance:
    wheel: str
    sha256: str
    size: int
    fingerprint: str
    inputs: dict[str, Any]
    toolchain: dict[str, str]
    format: int = RECORD_FORMAT
    signature: dict[str, str] | None = None  # {"key": "ed25519:...", "value": base64} over signed_content()

    @classmethod
    def read(cls, path: Path) -> Provenance:
        try:
            return cls.parse(path.read_bytes())
        except (OSError, ValueError, TypeError) as exc:
            raise RocwheelsError(
                f"{path}: not a readable provenance record ({exc})",
                fix="rebuild the wheel (make wheels ... --force) to write a new record",
            ) from None

    @classmethod
    def parse(cls, data: bytes) -> Provenance:
        """The record in ``data`` (a record file's bytes); ValueError or TypeError when it is not one."""
        fields = json.loads(data.decode("utf-8"))
        if not isinstance(fields, dict):
            raise ValueError("not a JSON object")
        return cls(**fields)

    def signed_content(self) -> bytes:
        """What the signature covers: every other field, as canonical JSON (sorted keys, no spaces, ASCII)."""
        fields = {key: value for key, value in asdict(self).items() if key != "signature"}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    def signature_check(self, trusted: tuple[str, ...]) -> SignatureCheck:
        return check_signature(self.signed_content(), self.signature, trusted)


def record_path(wheel: Path) -> Path:
    return wheel.with_name(wheel.name + SUFFIX)


def fingerprints(plan: Plan, recipes_dir: Path) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each step's (fingerprint, inputs), dependencies first (the plan's order)."""
    result: dict[str, tuple[str, dict[str, Any]]] = {}
    for step in plan.steps:
        inputs = _inputs(plan, step, recipes_dir)
        inputs["depends_on"] = {dep: result[dep][0] for dep in step.recipe.depends_on}
        result[step.name] = (_digest(inputs), inputs)
    return result


def _inputs(plan: Plan, step: BuildDescription, recipes_dir: Path) -> dict[str, Any]:
    recipe = step.recipe
    source = recipe.source
    inputs: dict[str, Any] = {
        "format": RECORD_FORMAT,
        "recipe": recipe.model_dump(mode="json"),
        "wheel_version": step.wheel_version,
        "line": {"name": plan.line_name, **plan.line.model_dump(mode="json", exclude={"versions"})},
        "targets": [str(target) for target in plan.targets],
        "driver": plan.driver,
        "patches": {patch: file_sha256(recipes_dir / patch) for patch in recipe.patches},
        "constraints": file_sha256(step.constraints) if step.constraints else None,
        "rocwheels": rocwheels_version(),
    }
    if source.path:
        inputs["source_tree"] = tree_sha256(recipes_dir / source.path)
    return inputs


def tree_sha256(folder: Path) -> str:
    """sha256 over the relative paths and bytes of a source folder (build products left out)."""
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_dir() or any(part in IGNORED_NAMES or part.endswith(".egg-info") for part in relative.parts):
            continue
        digest.update(f"{relative.as_posix()}\0{file_sha256(path)}\n".encode())
    return digest.hexdigest()


def _digest(data: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write_record(
    wheel: Path,
    fingerprint: str,
    inputs: dict[str, Any],
    toolchain: dict[str, str],
    signer: SigningKey | None = None,
) -> Path:
    """Write ``<wheel>.provenance.json`` beside the wheel, all at once; signed by ``signer`` if given."""
    record = Provenance(wheel.name, file_sha256(wheel), wheel.stat().st_size, fingerprint, inputs, toolchain)
    if signer is not None:
        record = replace(record, signature=signer.sign(record.signed_content()))
    target = record_path(wheel)
    with atomic_write(target, mode=0o644) as sink:
        sink.write(json.dumps(asdict(record), indent=2, sort_keys=True).encode("utf-8"))
    return target


def is_current(wheel: Path, fingerprint: str) -> bool:
    """True when the wheel's record names this fingerprint and still describes this file.

    Cheap on purpose (no hashing of multi-GB wheels): size and fingerprint; ``check_record``
    (verify) compares the full sha256.
    """
    path = record_path(wheel)
    if not path.is_file():
        return False
    try:
        record = Provenance.read(path)
    except RocwheelsError:
        return False
    return record.fingerprint == fingerprint and record.wheel == wheel.name and record.size == wheel.stat().st_size


def check_record(wheel: Path, sha256: str | None = None) -> tuple[bool, str]:
    """(ok, message) for the record beside ``wheel``; a wheel without one is ok but said so.
    ``sha256``: the wheel's, when the caller has it already."""
    path = record_path(wheel)
    if not path.is_file():
        return (
            True,
            f"no provenance record ({path.name}) beside the wheel yet: rocwheels wheels writes it once the wheel passes",
        )
    try:
        record = Provenance.read(path)
    except RocwheelsError as exc:
        return False, str(exc)
    if record.wheel != wheel.name:
        return False, f"{path.name} describes {record.wheel}, not this wheel"
    actual = sha256 or file_sha256(wheel)
    if actual != record.sha256:
        return False, (
            f"sha256 {actual} differs from the provenance record's {record.sha256}: the wheel changed after it was "
            f"verified (fix: rebuild it with rocwheels wheels ... --force)"
        )
    return True, f"fingerprint {record.fingerprint[:12]}, sha256 matches"


Level = Literal["ok", "warning", "error"]


def check_record_signature(wheel: Path, trusted: tuple[str, ...] | None) -> tuple[Level, str] | None:
    """(level, message) on the signature of the record beside ``wheel``; None when it has no readable record.

    ``trusted``: the public keys of the lock (None outside a project: who may sign is not known).
    A signature that does not match the record is an error whoever signed; a key the lock does
    not list is an error where the lock is known; an unsigned record is only worth a warning when
    the lock expects signatures, as reuse from an index then builds the wheel again rather than
    believe it.
    """
    path = record_path(wheel)
    if not path.is_file():
        return None
    try:
        record = Provenance.read(path)
    except RocwheelsError:
        return None  # check_record reports it
    check = record.signature_check(trusted or ())
    if check.trust is Trust.SIGNED:
        return "ok", check.message
    if check.trust is Trust.FORGED:
        return "error", (
            f"{path.name}: {check.message}: the record was changed after it was signed, or forged "
            "(fix: rebuild the wheel with rocwheels wheels ... --force where the signing key is set)"
        )
    if check.trust is Trust.UNKNOWN_KEY:
        if trusted is None:
            return "warning", f"{check.message}; outside a rocwheels project the trusted keys are not known"
        return "error", (
            f"{path.name}: {check.message} (fix: add the key to [signing] public_keys in the lock if it is the "
            "team's, else rebuild the wheel where the team's key is set)"
        )
    if trusted:
        return "warning", (
            f"{path.name} is not signed: publish sends it, but CI reuse (--from-index) builds this wheel again "
            "rather than believe it (sign records by setting ROCWHEELS_SIGNING_KEY where wheels are built)"
        )
    return "ok", "not signed (the lock lists no signing keys)"
