"""The worker process: what it leaves in its log when the sweep gives up on it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune_cli.worker import STACKS_SIGNAL

ROOT = Path(__file__).resolve().parents[2]


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


def _hand_off(inbox: Path, tmp: Path, name: str, kernel: str, dims: dict[str, int]) -> Path:
    import json

    from autotune_cli.spec import Budget, Tolerance

    job = {"kernel": kernel, "dims": dims, "dtype": "bf16", "warm_start": None, "spawned_at": time.time(),
           "budget": Budget(effort="none").model_dump(), "tolerance": Tolerance(atol=0.01, factor=2.0).model_dump()}
    (tmp / f"{name}.json").write_text(json.dumps(job))
    paths = {"job": str(tmp / f"{name}.json"), "result": str(tmp / f"{name}.result.json"),
             "status": str(tmp / f"{name}.status.json"), "log": str(tmp / f"{name}.log")}
    (inbox / "job.tmp").write_text(json.dumps(paths))
    os.replace(inbox / "job.tmp", inbox / "job")
    return tmp / f"{name}.result.json"


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 300) -> dict:
    import json

    end = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None, f"worker exited ({proc.returncode}) before writing {path.name}"
        assert time.monotonic() < end, f"no {path.name} after {seconds} s"
        time.sleep(0.1)
    return json.loads(path.read_text())


def test_a_warm_worker_serves_combos_in_turn_and_leaves_after_one_without_entry(tmp_path):
    """`worker --serve`: each combo's output goes to its own log, the worker stays for the next
    combo after an entry, and exits after a combo that produced none (its state is suspect)."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    env = {**os.environ, "HELION_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen([sys.executable, "-m", "autotune_cli.worker", "--serve", str(inbox)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        dims = {"rows": 64, "d": 64, "group_size": 32, "has_z": 1, "norm_before_gate": 0, "has_bias": 0,
                "is_rms": 1, "weight_fp32": 1}
        first = _wait_for(_hand_off(inbox, tmp_path, "a", "gated_norm_fwd", dims), proc)
        assert first["entry"] is not None and first["phases"]["start"] > 0.5  # imports paid here
        second = _wait_for(_hand_off(inbox, tmp_path, "b", "gated_norm_bwd", dims), proc)
        assert second["entry"] is not None and second["phases"]["start"] < first["phases"]["start"] / 2
        assert "phases: start" in (tmp_path / "a.log").read_text()
        assert "phases: start" in (tmp_path / "b.log").read_text()
        third = _wait_for(_hand_off(inbox, tmp_path, "c", "no_such_kernel", dims), proc)
        assert third.get("entry") is None and "no_such_kernel" in third["error"], third
        assert proc.wait(timeout=60) == 0  # it left
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
