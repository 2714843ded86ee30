"""Test helper: run Python code in child processes and say how each one ended.

The lowering tests run their cases in compiled-mode children (tests/conftest.py's
`lowering_processes`). A child that dies (the OOM killer's SIGKILL on a loaded machine, a
crash in the compiler) must be reported with its exit code or signal, its peak memory and
the tail of its stderr, never as an empty message; one that runs past its (generous) time
limit is killed and reported the same way, not left to raise in a fixture.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

# Seconds a lowering child gets per case it lowers, and at least: generous, for a loaded 2-core
# machine where one case takes a few seconds of CPU and the imports about 10.
SECONDS_PER_CASE = 60.0
MIN_SECONDS = 1800.0


@dataclasses.dataclass
class Ended:
    """How a child ended: its output, exit status and peak resident memory."""

    argv: list[str]
    returncode: int  # negative: killed by that signal (as subprocess reports it)
    stdout: str
    stderr: str
    maxrss_mb: float
    seconds: float
    timed_out: bool

    def how(self) -> str:
        """One line: 'exit code 1' or 'killed by signal 9 (SIGKILL)', peak memory, time."""
        if self.timed_out:
            what = "ran past its time limit and was killed"
        elif self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = "?"
            what = f"killed by signal {-self.returncode} ({name}{': out of memory?' if name == 'SIGKILL' else ''})"
        else:
            what = f"exit code {self.returncode}"
        return f"{what}, peak RSS {self.maxrss_mb:.0f} MB, after {self.seconds:.0f} s"

    def stderr_tail(self, chars: int = 3000) -> str:
        tail = self.stderr.strip()[-chars:]
        return tail if tail else "(stderr empty)"


def run(argv: list[str], *, input_text: str = "", env: dict[str, str] | None = None,
        timeout_s: float) -> Ended:
    """Run `argv` to its end (killed after `timeout_s`), reading its peak memory from wait4."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)
    out: list[str] = []
    err: list[str] = []
    readers = [threading.Thread(target=lambda f=f, acc=acc: acc.append(f.read()), daemon=True)
               for f, acc in ((proc.stdout, out), (proc.stderr, err))]
    for t in readers:
        t.start()
    assert proc.stdin is not None
    try:
        proc.stdin.write(input_text)
        proc.stdin.close()
    except BrokenPipeError:  # it died before reading its input: its status says how
        pass
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() - t0 > timeout_s:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            pid, status, usage = os.wait4(proc.pid, 0)
            break
        time.sleep(0.2)
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    for t in readers:
        t.join(timeout=30)
    # ru_maxrss is in kilobytes on Linux.
    return Ended(argv, proc.returncode, "".join(out), "".join(err), usage.ru_maxrss / 1024,
                 time.monotonic() - t0, timed_out)


def env_key(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """`env` as the key of a once-per-process lowering (the lowering modules' `functools.cache`),
    without PYTEST_CURRENT_TEST: pytest sets it to the test being set up, and a module fixture set
    up again under another test (pytest-xdist ran another module's test in between) must find the
    lowering done, not lower every case again."""
    return tuple(sorted((k, v) for k, v in env.items() if k != "PYTEST_CURRENT_TEST"))


def run_cases(code: str, cases: list[tuple[Any, ...]], n: int, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Split `cases` over `n` children running `code` (cases as JSON on stdin, one JSON line
    {"id", "ok", "error"} per case on stdout). A child that did not end with exit code 0 adds
    "__worker__": its exit code or signal, peak memory, how many of its cases it reported, and
    its stderr's tail."""
    parts = [cases[i::n] for i in range(n)]

    def one(part: list[tuple[Any, ...]]) -> Ended:
        limit = max(MIN_SECONDS, SECONDS_PER_CASE * len(part))
        return run([sys.executable, "-c", code], input_text=json.dumps(part), env=env, timeout_s=limit)

    with ThreadPoolExecutor(max_workers=n) as pool:
        done = list(pool.map(one, parts))
    results: dict[str, dict[str, Any]] = {}
    deaths = []
    for i, (part, ended) in enumerate(zip(parts, done)):
        reported = 0
        for line in ended.stdout.splitlines():
            if line.startswith("{"):
                r = json.loads(line)
                results[r["id"]] = r
                reported += 1
        if ended.returncode != 0 or ended.timed_out:
            deaths.append(f"lowering worker {i + 1} of {n} ({reported} of {len(part)} cases reported): "
                          f"{ended.how()}; stderr: {ended.stderr_tail()}")
    if deaths:
        results["__worker__"] = {"ok": False, "error": " | ".join(deaths)}
    return results
