"""The one way rocwheels runs external commands: log the exact command, then run it.

Every stage shells out through :func:`run`, so the log always shows what was executed
(``+ command``), and a build step can tee its output to the package's own log file.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import CommandError
from pipeline.util.interrupts import held_while
from pipeline.util.log import AnyLogger

log = logging.getLogger("rocwheels")

# How many trailing output lines a failure message quotes (the whole output is in the log file, if any).
_TAIL_LINES = 40


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    env: Mapping[str, str | None] | None = None,
    cwd: Path | None = None,
    log_file: Path | None = None,
    check: bool = True,
    redact: Sequence[str] = (),
    logger: AnyLogger | None = None,
    input: str | None = None,
    on_output: Callable[[str], None] | None = None,
    quiet: bool = False,
) -> Result:
    """Run ``args`` (no shell), logging ``+ command`` first.

    ``env`` is merged over the current environment (a None value unsets that variable). With ``log_file`` the combined output is
    appended there (the result keeps only its tail); otherwise it is captured and returned.
    Strings in ``redact`` are masked wherever they would be logged. ``on_output`` sees each
    output line as it arrives (a progress display shows the latest one). ``quiet`` logs the
    command at debug level (probes whose output is only parsed).
    """
    argv = [os.fspath(a) for a in args]
    shown = _mask(shlex.join(argv), redact)
    (logger or log).log(logging.DEBUG if quiet else logging.INFO, "+ %s", shown)
    full_env = None if env is None else {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    if log_file is None:
        completed = subprocess.run(
            argv,
            env=full_env,
            cwd=cwd,
            input=input,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
        output = _mask(completed.stdout, redact)
        returncode = completed.returncode
    else:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        last_lines: deque[str] = deque(maxlen=_TAIL_LINES)
        with log_file.open("a", encoding="utf-8") as sink:
            sink.write(f"+ {shown}\n")
            sink.flush()
            proc: subprocess.Popen[str] | None = None
            try:
                with held_while():
                    proc = subprocess.Popen(
                        argv,
                        env=full_env,
                        cwd=cwd,
                        text=True,
                        errors="replace",
                        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                    )
                if input is not None:
                    assert proc.stdin is not None
                    proc.stdin.write(input)
                    proc.stdin.close()
                assert proc.stdout is not None
                for line in proc.stdout:
                    line = _mask(line, redact)
                    sink.write(line)
                    last_lines.append(line)
                    if on_output is not None:
                        on_output(line)
                returncode = proc.wait()
            except BaseException:
                # Interrupted (SIGTERM reaches only rocwheels): the command must not go on writing.
                if proc is not None:
                    _stop(proc)
                raise
            sink.write(f"# exit code {returncode}\n")
        output = "".join(last_lines)
    if check and returncode != 0:
        raise CommandError(shown, returncode, log_file, tail(output))
    return Result(returncode, output)


def uv_binary() -> str | None:
    """The uv executable of rocwheels' environment (the ``uv`` package), or None without it."""
    try:
        from uv import find_uv_bin
    except ImportError:
        return None
    try:
        return find_uv_bin()
    except FileNotFoundError:
        return None


def tail(output: str, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of a command's output: what a failure message quotes, so the user
    sees why a tool failed even when its output was captured rather than shown."""
    return "".join(output.splitlines(keepends=True)[-lines:])


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM first, so a Python tool (auditwheel) can remove its temporary files; SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# Login headers a tool may print (twine --verbose, requests' debug output): their values never reach a log.
_LOGIN_HEADER = re.compile(
    r"(?i)\b((?:proxy-)?authorization|cookie|x-api-key)(['\"]?\s*[:=]\s*['\"]?)(?:(basic|bearer|token)\s+)?[^\s'\",}]+"
)


def _mask(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "****")
    return _LOGIN_HEADER.sub(lambda m: f"{m[1]}{m[2]}{m[3] + ' ' if m[3] else ''}****", text)
