"""The subprocess helper: a failure message carries the tail of what the command printed."""

from __future__ import annotations

import sys

import pytest

from pipeline.cmd import run
from pipeline.errors import CommandError

# Prints 100 numbered lines, the last one on stderr, then fails.
NOISY = "import sys\nfor i in range(99): print(f'line {i}')\nprint('the real reason', file=sys.stderr)\nsys.exit(3)"


def test_captured_failure_quotes_the_last_lines():
    with pytest.raises(CommandError) as failure:
        run([sys.executable, "-c", NOISY])
    message = str(failure.value)
    assert "exit code 3" in message
    assert message.rstrip().endswith("the real reason")
    assert "line 98" in message and "line 10\n" not in message  # the tail, not the whole output


def test_logged_failure_names_the_log_and_quotes_its_tail(tmp_path):
    log = tmp_path / "logs" / "step.log"
    with pytest.raises(CommandError) as failure:
        run([sys.executable, "-c", NOISY], log_file=log)
    assert str(log) in str(failure.value) and "the real reason" in str(failure.value)
    assert "line 0\n" in log.read_text()  # the whole output stays in the log
