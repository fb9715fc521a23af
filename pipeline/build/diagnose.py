"""The one line a failed build's summary shows: the compiler's first error, not the build tool's traceback.

A failing compile ends in 40 lines of setuptools or CMake traceback; what the user needs is the
first ``error:`` the compiler printed (``invalid target ID 'gfx942'``), usually far above.
"""

from __future__ import annotations

import re
from pathlib import Path

# clang/gcc/hipcc ("file:1:2: error: ...", "clang: error: ...", "fatal error: ..."), CMake, nvcc-style
# hipcc wrappers, the linker, and pip's resolver: the first match in the log is the cause.
_ERROR = re.compile(
    r"(?:^|\s)(?:fatal error|error)(?:\s*\[[^\]]*\])?:\s*\S"
    r"|^CMake Error\b"
    r"|^ld(?:\.\w+)?: .*(?:undefined reference|cannot find)"
    r"|^ERROR: (?:Could not|No matching|Cannot)",
    re.IGNORECASE | re.MULTILINE,
)
# Lines that say "error" without being one (setuptools' and pip's wrap-up, make's echo of the failure).
_NOT_THE_CAUSE = re.compile(
    r"^(?:error: command '.*' failed|ERROR Backend subprocess exited|subprocess-exited-with-error"
    r"|make(?:\[\d+\])?: \*\*\*|ninja: build stopped|\s*error: subprocess)",
    re.IGNORECASE,
)
_LONGEST = 300


def first_error(log_text: str) -> str | None:
    """The first line of ``log_text`` that states a compiler, CMake, linker or installer error."""
    for match in _ERROR.finditer(log_text):
        start = log_text.rfind("\n", 0, match.start()) + 1
        end = log_text.find("\n", match.start())
        line = log_text[start : end if end != -1 else None].strip()
        if not _NOT_THE_CAUSE.match(line):
            return line if len(line) <= _LONGEST else line[: _LONGEST - 1] + "…"
    return None


def first_error_in(log_file: Path | None) -> str | None:
    """:func:`first_error` of a build log, where there is one to read."""
    if log_file is None or not log_file.is_file():
        return None
    return first_error(log_file.read_text(encoding="utf-8", errors="replace"))
