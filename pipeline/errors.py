"""Errors a user can act on: the CLI prints them without a traceback."""

from __future__ import annotations

from pathlib import Path


class RocwheelsError(Exception):
    """A failure explained for the user: what went wrong and, where known, how to fix it.

    The command line prints it without a traceback and exits with ``exit_code``: 1, a check
    failed or a step could not be done.
    """

    exit_code = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.message}\n  fix: {self.fix}" if self.fix else self.message


class InputError(RocwheelsError):
    """The user's input is wrong (a file, an option, a value): exit status 2, as for a usage error."""

    exit_code = 2


class ConfigError(InputError):
    """A recipe or lock value is wrong: names the file and the field."""

    def __init__(self, file: Path | str, field: str, message: str, *, fix: str | None = None) -> None:
        where = f"{file}: {field}" if field else str(file)
        super().__init__(f"{where}: {message}", fix=fix)
        self.file = str(file)
        self.field = field


class CommandError(RocwheelsError):
    """An external command exited non-zero."""

    def __init__(self, command: str, returncode: int, log: Path | None = None, output: str = "") -> None:
        where = f" (log: {log})" if log else ""
        tail = f"\n{output.rstrip()}" if output.strip() else ""
        super().__init__(f"command failed with exit code {returncode}{where}: {command}{tail}")
        self.command = command
        self.returncode = returncode
        self.output = output


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: unwinds like KeyboardInterrupt (every ``finally`` cleans up), and
    ``except Exception`` never swallows it. Exit status 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum
