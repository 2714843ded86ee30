"""The worker process: what it leaves in its log when the sweep gives up on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_stacks_reach_the_log_before_the_deadline_while_fd2_points_elsewhere(tmp_path):
    """A search hangs inside Helion's output capture (fd 2 pointed at a temporary file) and
    inside Triton's compiler (where a SIGUSR1 handler wrote nothing on the H200). The
    worker's own timer must still write the stacks to its log before the sweep's deadline."""
    log = tmp_path / "worker.log"
    code = ("import os, tempfile, time\n"
            "import autotune_cli.worker as w\n"
            "fd, _ = tempfile.mkstemp()\n"
            "os.dup2(fd, 2)  # as helion.autotuner.logger.capture_output does\n"
            "print(w.arm_stack_dump(2.0), flush=True)\n"
            "time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, env=env)
        try:
            assert proc.stdout is not None
            assert float(proc.stdout.readline()) == 1.0  # half of a 2 s timeout
            t0 = time.time()
            while "most recent call first" not in log.read_text() and time.time() - t0 < 10:
                time.sleep(0.05)
            waited = time.time() - t0
        finally:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "most recent call first" in text and "<string>" in text, text  # the -c code's frame
    assert waited < 2.0


def test_the_dump_leaves_ten_seconds_before_long_deadlines():
    import faulthandler

    from autotune_cli.worker import arm_stack_dump

    try:
        assert arm_stack_dump(720.0) == 710.0
        assert arm_stack_dump(None) is None and arm_stack_dump(0) is None
    finally:
        faulthandler.cancel_dump_traceback_later()
