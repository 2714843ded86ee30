"""The worker process: what it leaves in its log when the sweep gives up on it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_stacks_reach_the_log_while_fd2_points_elsewhere(tmp_path):
    """A search hangs inside Helion's output capture (fd 2 pointed at a temporary file); the
    stacks written on SIGUSR1 must still land in the worker's log, as on the H200 they did not
    before the worker kept its own copy of the log's descriptor."""
    log = tmp_path / "worker.log"
    code = ("import os, tempfile, time\n"
            "import autotune_cli.worker\n"
            "fd, _ = tempfile.mkstemp()\n"
            "os.dup2(fd, 2)  # as helion.autotuner.logger.capture_output does\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, env=env)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            proc.send_signal(signal.SIGUSR1)
            deadline = time.time() + 10
            while "most recent call first" not in log.read_text() and time.time() < deadline:
                time.sleep(0.1)
        finally:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "most recent call first" in text and "<string>" in text, text  # the -c code's frame
