"""Which platform tag a wheel's contents allow: auditwheel's own policy analysis (symbol
versions of glibc, libstdc++ and friends, instruction-set level, blacklisted symbols).

verify asks of every wheel (repair asks the same analysis in ``audit.analyze``): a ``manylinux_2_X``
tag is a promise that the wheel runs on any distribution with glibc 2.X, and only the contents can
keep it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from auditwheel.error import AuditwheelError, NonPlatformWheelError
from auditwheel.wheel_abi import analyze_wheel_abi
from elftools.common.exceptions import ELFError

from .analyze import DEFAULT_LIBRARY_DIRS, MUSL_LIBRARY_DIRS


@dataclass(frozen=True)
class AllowedPlatform:
    best: str  # the most compatible tag the contents allow (linux_x86_64 when no manylinux one is)
    problem: str | None  # why the tag asked about is not allowed; None when it is


def check_platform_tag(wheel: Path, tag: str, excludes: Sequence[str]) -> AllowedPlatform | None:
    """Whether the contents of ``wheel`` allow platform ``tag``; None for a wheel without ELF files.

    ``excludes`` are the soname patterns repair left out of the wheel (ROCm's, linked packages'):
    their symbols are the target machine's business, as in ``auditwheel repair --exclude``.
    """
    # auditwheel logs each file it reads at INFO: keep rocwheels' output to its own lines.
    logging.getLogger("auditwheel").setLevel(logging.WARNING)
    # The system folders of the tag's C library only: not the build host's LD_LIBRARY_PATH (nor
    # auditwheel's in-process cache of it, which a later lddtree call would inherit).
    folders = MUSL_LIBRARY_DIRS if tag.startswith("musllinux") else DEFAULT_LIBRARY_DIRS
    try:
        abi = analyze_wheel_abi(None, None, wheel, frozenset(excludes), disable_isa_ext_check=False, allow_graft=True,
                                args_ldpaths=":".join(folders))
    except NonPlatformWheelError:
        return None
    except (AuditwheelError, ELFError) as exc:
        return AllowedPlatform("unknown", f"auditwheel cannot analyse it for {tag}: {exc}")
    best = abi.overall_policy
    try:
        wanted = abi.policies.get_policy_by_name(tag)
    except LookupError:
        known = ", ".join(p.name for p in abi.policies)
        return AllowedPlatform(best.name, f"{tag} is no platform tag auditwheel knows ({known})")
    if wanted.priority <= best.priority:  # higher priority: runs on more (older) systems
        return AllowedPlatform(best.name, None)
    limits = {"symbol versions": abi.sym_policy, "instruction set": abi.machine_policy, "blacklisted symbols": abi.blacklist_policy,
              "UCS-2 symbols": abi.ucs_policy, "PyFPE_jbuf": abi.pyfpe_policy}
    reasons = [f"{what} allow at most {policy.name}" for what, policy in limits.items() if policy.priority < wanted.priority]
    too_new = sorted(f"{library} {version}" for library, versions in abi.versioned_symbols.items() for version in versions
                     if version.partition("_")[2] not in wanted.symbol_versions.get(version.partition("_")[0], {version.partition("_")[2]}))
    if too_new:
        reasons.append(f"needs {', '.join(too_new)}")
    return AllowedPlatform(best.name, f"its contents do not allow {tag} ({'; '.join(reasons)}); the most they allow is {best.name}")
