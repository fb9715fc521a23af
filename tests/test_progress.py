"""Long steps stay visible: off a terminal (CI logs) a heartbeat line names the step and its output."""

import logging

from pipeline.util import progress


def test_heartbeat_off_a_terminal(monkeypatch, caplog):
    monkeypatch.setattr(progress, "HEARTBEAT_SECONDS", 0.0)
    logger = logging.getLogger("rocwheels.test-progress")
    with caplog.at_level(logging.INFO, logger=logger.name), progress.long_step("torch: build", logger) as on_output:
        on_output("[1234/5678] Building HIP object aten/src/ATen/native/hip/Loss.hip.o\n")
    (record,) = caplog.records
    assert "torch: build: still running after" in record.getMessage()
    assert "Loss.hip.o" in record.getMessage()
