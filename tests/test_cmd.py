"""The subprocess helper: a failure message carries the tail of what the command printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from unittest.mock import patch

import pytest

from pipeline.errors import CommandError, Interrupted
from pipeline.util.cmd import run
from pipeline.util.interrupts import interruptible
from tests.helpers.waiting import wait_for

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


def test_a_signal_while_a_child_starts_stops_the_child(tmp_path):
    """SIGTERM inside Popen (a CI cancel just as a command starts) must not orphan the command."""
    started = tmp_path / "started"
    finished = tmp_path / "finished"
    real_popen = subprocess.Popen

    def popen_then_signal(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        wait_for(started.exists, "the child starts")
        os.kill(os.getpid(), signal.SIGTERM)  # arrives before Popen has returned the child
        return child

    with interruptible(), pytest.raises(Interrupted) as stopped:
        with patch.object(subprocess, "Popen", popen_then_signal):
            run(["sh", "-c", f"touch {started}; sleep 2; touch {finished}"], log_file=tmp_path / "log")
    assert stopped.value.exit_code == 143
    time.sleep(2.5)
    assert not finished.exists(), "the command went on after rocwheels stopped"
