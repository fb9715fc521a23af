"""GPU targets: parse the user's ARCH string, check it, and format it for each recipe.

A target is an LLVM processor name (``gfx942``) or generic target (``gfx11-generic``),
optionally with target features (``gfx90a:xnack+``). Three sets must agree before anything runs:
the processors AMD/LLVM define, the ones the lock line's ROCm toolchain compiles, and the ones the
recipe supports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pipeline.config.gpu_processors import gpu_processors, warn_if_unverified
from pipeline.errors import InputError

_TARGET_ID = re.compile(r"^(gfx[0-9a-f]+(?:-[0-9]+)*(?:-generic)?)((?::(?:sramecc|xnack)[+-])*)$")


@dataclass(frozen=True)
class GpuTarget:
    processor: str  # gfx942
    features: str = ""  # ":sramecc+:xnack-" or ""

    def __str__(self) -> str:
        return self.processor + self.features


def known_processors() -> dict[str, str]:
    """Processor or generic target name -> what hardware it is, from ``data/gfx-targets.toml``."""
    table = gpu_processors()
    return {name: table.describe(name) for name in table.by_name}


def runs_on(code_target: str, processor: str) -> bool:
    """Whether a code object compiled for ``code_target`` (a processor or a generic target) loads on ``processor``."""
    entry = gpu_processors().by_name.get(code_target)
    return code_target == processor or (entry is not None and processor in entry.serves)


def known_processor_list(processors: tuple[str, ...]) -> tuple[str, ...]:
    """``processors`` unchanged if AMD/LLVM defines each of them; a ValueError (for the models' validators) otherwise."""
    unknown = [p for p in processors if p not in known_processors()]
    if unknown:
        raise ValueError(f"unknown GPU processor(s) {', '.join(unknown)}; known: {', '.join(known_processors())}")
    return processors


def parse_targets(arch: str) -> tuple[GpuTarget, ...]:
    """Parse ``gfx942``, ``gfx90a;gfx942``, ``gfx90a,gfx942`` or space-separated lists.

    Each processor must be one AMD/LLVM defines; duplicates are dropped, order is kept.
    """
    parsed: list[GpuTarget] = []
    for word in filter(None, re.split(r"[;,\s]+", arch.strip())):
        match = _TARGET_ID.match(word)
        if not match or match.group(1) not in known_processors():
            raise InputError(
                f"unknown GPU target {word!r} in ARCH={arch!r}",
                fix=f"use AMD processor names such as gfx90a or gfx942; known: {', '.join(known_processors())}",
            )
        features = re.findall(r":(\w+)[+-]", match.group(2))
        repeated = sorted({name for name in features if features.count(name) > 1})
        if repeated:  # gfx90a:xnack+:xnack- asks for code that both has and lacks the feature
            raise InputError(
                f"GPU target {word!r} in ARCH={arch!r} sets {', '.join(repeated)} more than once",
                fix=f"give each feature once, e.g. {match.group(1)}:{repeated[0]}+ or {match.group(1)}:{repeated[0]}-",
            )
        target = GpuTarget(match.group(1), match.group(2))
        warn_if_unverified(target.processor)
        if target not in parsed:
            parsed.append(target)
    if not parsed:
        raise InputError("no GPU target given", fix="set ARCH, for example ARCH=gfx942 or ARCH='gfx90a;gfx942'")
    return tuple(parsed)


def check_supported(targets: Iterable[GpuTarget], supported: Sequence[str], *, what: str) -> None:
    """Fail naming every target outside ``supported`` (processor names) and listing the valid ones."""
    rejected = [str(t) for t in targets if t.processor not in supported]
    if rejected:
        raise InputError(
            f"GPU target(s) {', '.join(rejected)} not supported by {what}",
            fix=f"choose from: {', '.join(supported)}",
        )


def format_targets(targets: Iterable[GpuTarget], *, separator: str, prefix: str = "") -> str:
    """Render targets the way one package reads them: ``gfx90a;gfx942`` or ``--offload-arch=gfx90a ...``."""
    return separator.join(prefix + str(t) for t in targets)
