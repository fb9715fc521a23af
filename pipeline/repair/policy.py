"""Which shared libraries a wheel must not carry: ROCm's (linked from the machine) and those of
packages it links against (torch's, linked from the installed torch).

The list itself is data (``data/rocm-libraries.toml``); repair passes it to auditwheel as
``--exclude`` patterns, and verify uses the same policy to check that no ROCm library ended up
inside a wheel.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from functools import cache
from pathlib import PurePosixPath

from pipeline.errors import RocwheelsError

# auditwheel renames a grafted `libfoo.so.1` to `libfoo-<first 8 hex digits of its sha256>.so.1`;
# matching must see through that, or a grafted ROCm library would pass as foreign.
_GRAFTED_NAME = re.compile(r"^(?P<base>[^.]+)-[0-9a-f]{8}(?P<ext>\..+)$")


@dataclass(frozen=True)
class RocmPolicy:
    patterns: tuple[str, ...]  # ROCm libraries, fnmatch patterns over sonames
    extra_excludes: tuple[str, ...] = ()  # the recipe's own (torch's libraries, say)

    @property
    def excludes(self) -> tuple[str, ...]:
        """Everything auditwheel must not graft: ROCm's libraries, then the recipe's."""
        return self.patterns + tuple(p for p in self.extra_excludes if p not in self.patterns)

    def is_rocm(self, soname: str) -> bool:
        """Whether ``soname`` (a NEEDED entry, a path, or a name auditwheel grafted) is ROCm's."""
        return _matches(soname, self.patterns)

    def is_excluded(self, soname: str) -> bool:
        """Whether ``soname`` is ROCm's or one of the recipe's extra excludes."""
        return _matches(soname, self.excludes)


@dataclass(frozen=True)
class LinkPackage:
    """Libraries a wheel uses from another installed package instead of grafting copies.

    Written ``"<lib folder in site-packages>:<soname pattern>[,<pattern>...]"``, for example
    ``"torch/lib:libtorch*.so,libc10*.so"``: files needing a matching library get
    ``$ORIGIN/<relative path to torch/lib>`` in their RPATH, and the patterns are excluded
    from grafting.
    """

    lib_dir: str
    patterns: tuple[str, ...]

    @classmethod
    def parse(cls, entry: str) -> LinkPackage:
        lib_dir, _, patterns = entry.partition(":")
        parsed = tuple(p.strip() for p in patterns.split(",") if p.strip())
        folder = PurePosixPath(lib_dir.strip())
        if (
            not parsed
            or folder.is_absolute()
            or ".." in folder.parts
            or str(folder) == "."
            or any("/" in p for p in parsed)
        ):
            raise RocwheelsError(
                f"link_packages entry {entry!r} is not '<lib folder in site-packages>:<soname patterns>'",
                fix="write it like 'torch/lib:libtorch*.so,libc10*.so' in the recipe's [repair] link_packages",
            )
        return cls(str(folder), parsed)

    def provides(self, soname: str) -> bool:
        return any(fnmatchcase(soname, pattern) for pattern in self.patterns)


def load_policy(extra_excludes: Iterable[str] = ()) -> RocmPolicy:
    """The packaged ROCm library list plus the recipe's ``[repair] exclude`` patterns."""
    extra = tuple(dict.fromkeys(extra_excludes))
    for pattern in extra:
        if not pattern.strip() or pattern != pattern.strip():
            raise RocwheelsError(
                f"repair exclude pattern {pattern!r} is empty or has surrounding spaces",
                fix="write soname patterns such as 'libtorch*.so' in the recipe's [repair] exclude",
            )
    return RocmPolicy(patterns=rocm_patterns(), extra_excludes=extra)


@cache
def rocm_patterns() -> tuple[str, ...]:
    """All patterns of ``data/rocm-libraries.toml``, in file order, without duplicates."""
    # Imported here: a repair that only copies a wheel it wrote before never reads the list.
    import tomllib
    from importlib import resources

    text = resources.files("pipeline").joinpath("data/rocm-libraries.toml").read_text(encoding="utf-8")
    groups: dict[str, list[str]] = tomllib.loads(text)["libraries"]
    return tuple(dict.fromkeys(pattern for patterns in groups.values() for pattern in patterns))


def _matches(soname: str, patterns: tuple[str, ...]) -> bool:
    name = soname.rsplit("/", 1)[-1]
    grafted = _GRAFTED_NAME.match(name)
    candidates = (name, grafted["base"] + grafted["ext"]) if grafted else (name,)
    # Case-sensitive like the dynamic loader (fnmatch.fnmatch would follow os.path.normcase).
    return any(fnmatchcase(candidate, pattern) for candidate in candidates for pattern in patterns)
