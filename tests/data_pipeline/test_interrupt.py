"""Stop signals in the data stages' process pools (data_pipeline/interrupt.py)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from data_pipeline.interrupt import stop_signals


@pytest.mark.skipif(sys.platform != "linux", reason="the stages fork their pool workers on Linux only")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_forked_before_its_initializer_ignores_a_stop_signal(sig):
    """A stop signal sent to the stage's process group (`kill -TERM -pgid`, a scheduler, Ctrl-C) can reach a pool
    worker between its fork and its initializer, which sets SIG_IGN. The worker inherited the driver's handler,
    so it raised StageInterrupted inside the initializer, and the stage printed an 'Exception in initializer'
    traceback (CI, tests/faults/test_data_stage_faults.py, clean-SIGTERM). The driver alone decides to stop: in a
    forked child the inherited handler must do nothing."""
    with stop_signals():
        pid = os.fork()
        if pid == 0:  # the worker, before any initializer
            code = 0
            try:
                os.kill(os.getpid(), sig)  # Python runs the handler at the next bytecode, inside this try
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
