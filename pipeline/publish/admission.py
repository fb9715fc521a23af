"""Only verified wheels reach teammates: publish and ``index build`` verify every wheel they hand on.

``rocwheels wheels`` puts only verified wheels into the wheelhouse, but the wheelhouse is a folder:
a wheel repaired into it by hand, copied in, or changed after it was verified sits there like any
other, and its provenance record can be edited. So each wheel is verified again as it leaves,
with or without a record: the archive and its RECORD hashes, the verify rules of its description
(``describe_wheel``; the defaults of ``unknown_wheel`` for a wheel the project cannot tell), the
record's sha256 and signature. The smoke test is left out: it needs the target's GPU stack and
minutes per wheel, and the wheel passed it on its way in. A wheel that fails is named with its
reasons and left out; the others still go.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.config.layout import Layout
from pipeline.config.lock import trusted_keys
from pipeline.description import unknown_wheel
from pipeline.errors import InputError, RocwheelsError
from pipeline.publish.index import WheelFile, wheel_file
from pipeline.verify.verify import verify_wheel

log = logging.getLogger("rocwheels")


@dataclass(frozen=True)
class Refused:
    path: Path
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Admission:
    admitted: tuple[WheelFile, ...]
    refused: tuple[Refused, ...]

    def require_some(self) -> Admission:
        """Itself, or an error naming every refusal when no wheel passed (nothing left to hand on)."""
        if self.refused and not self.admitted:
            raise RocwheelsError(f"every wheel was refused: {refusal_summary(self.refused)}", fix=REFUSAL_FIX)
        return self


REFUSAL_FIX = (
    "rebuild the refused wheels with rocwheels wheels ... --force (only wheels that pass verify belong in the "
    "wheelhouse), or remove them; rocwheels verify --no-smoke WHEEL shows every finding"
)


def refusal_summary(refused: tuple[Refused, ...]) -> str:
    return "; ".join(f"{r.path.name}: {r.reasons[0]}" for r in refused)


def admit_wheels(wheelhouse: Path, project: Layout | None) -> Admission:
    """Verify (without the smoke test) every ``*.whl`` directly in ``wheelhouse``.

    ``project``: the recipes and lock that describe the wheels and name the signing keys; None
    outside a project (each wheel then gets the defaults).
    """
    from pipeline.standalone import wheel_expectations

    trusted = trusted_keys(project.recipes_dir) if project else None
    admitted, refused = [], []
    for path in sorted(wheelhouse.glob("*.whl")):
        try:
            wheel = wheel_file(path)
            expect = wheel_expectations(project, path) if project else unknown_wheel(None)[1]
            report = verify_wheel(path, expect, smoke=False, trusted_keys=trusted, sha256=wheel.sha256)
        except InputError:
            raise  # the project itself (recipes, lock) is wrong: no wheel can be judged
        except RocwheelsError as exc:
            refused.append(Refused(path, (exc.message,)))
            continue
        if report.ok:
            admitted.append(wheel)
        else:
            refused.append(Refused(path, tuple(f"{f.check}: {f.message}" for f in report.errors())))
    for refusal in refused:
        log.error("%s refused (fails verify): %s", refusal.path.name, "; ".join(refusal.reasons))
    return Admission(tuple(admitted), tuple(refused))
