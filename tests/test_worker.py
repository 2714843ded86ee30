"""The worker process: what it leaves in its log when the sweep gives up on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_cli.worker import STACKS_SIGNAL

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(STACKS_SIGNAL is None, reason="no real-time signals on this platform")
def test_stacks_reach_the_log_while_fd2_points_elsewhere(tmp_path):
    """A search hangs inside Helion's output capture (fd 2 pointed at a temporary file). The
    stacks the worker writes on STACKS_SIGNAL must still land in its log, and the worker must
    survive writing them (the sweep kills it next)."""
    log = tmp_path / "worker.log"
    code = ("import os, tempfile, time\n"
            "import autotune_cli.worker as w\n"
            "w.install_stack_dump()\n"
            "fd, _ = tempfile.mkstemp()\n"
            "os.dup2(fd, 2)  # as helion.autotuner.logger.capture_output does\n"
            "print('ready', flush=True)\n"
            "while True:\n"
            "    sum(range(1000))  # busy in Python, not asleep in C\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=err, env=env)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
            proc.send_signal(STACKS_SIGNAL)
            t0 = time.time()
            while "most recent call first" not in log.read_text() and time.time() - t0 < 10:
                time.sleep(0.05)
            time.sleep(0.2)
            alive = proc.poll() is None
        finally:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "most recent call first" in text and "<string>" in text, text  # the -c code's frame
    assert alive


def test_the_signal_is_not_one_llvm_takes():
    import signal

    # LLVM's Unix signal handling takes SIGHUP, SIGINT, SIGTERM, SIGUSR2 (interrupt), SIGUSR1
    # (info) and the fatal signals; the real-time range is left alone.
    if STACKS_SIGNAL is None:
        pytest.skip("no real-time signals on this platform")
    assert signal.SIGRTMIN <= STACKS_SIGNAL <= signal.SIGRTMAX
