"""The lowering tests' child processes (tests/worker_processes.py): a child that dies is
reported with its exit code or signal, peak memory and stderr, never as an empty message."""

from __future__ import annotations

import os
import sys

import worker_processes
from worker_processes import run_cases

# Reads its cases, reports the first, then grows to ~200 MB and is SIGKILLed (as the OOM killer does).
KILLED = r"""
import json, os, signal, sys
cases = json.loads(sys.stdin.read())
print(json.dumps({"id": cases[0][0], "ok": True, "error": ""}), flush=True)
hog = bytearray(200 << 20)
os.kill(os.getpid(), signal.SIGKILL)
"""
FAILED = "import sys\nsys.stdin.read()\nsys.exit(3)\n"


def test_a_child_killed_by_a_signal_is_named_with_its_signal_and_peak_memory():
    env = dict(os.environ)
    res = run_cases(KILLED, [("a",), ("b",), ("c",)], 1, env)
    assert res["a"]["ok"] and "b" not in res
    error = res["__worker__"]["error"]
    assert error.startswith("lowering worker 1 of 1 (1 of 3 cases reported): killed by signal 9 (SIGKILL: "
                            "out of memory?), peak RSS "), error
    peak = float(error.split("peak RSS ")[1].split()[0])
    assert peak >= 200, error
    assert error.endswith("stderr: (stderr empty)"), error


def test_a_child_that_exits_non_zero_is_named_with_its_exit_code():
    res = run_cases(FAILED, [("a",), ("b",)], 2, dict(os.environ))
    error = res["__worker__"]["error"]
    assert error.count("exit code 3") == 2 and "worker 2 of 2 (0 of 1 cases reported)" in error, error


def test_a_child_past_its_limit_is_killed_and_says_so():
    ended = worker_processes.run([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1.0)
    assert ended.timed_out and ended.returncode == -9
    assert ended.how().startswith("ran past its time limit and was killed"), ended.how()
    assert ended.seconds < 30
