"""Worker process: tune one combo, or a series of them, and write each outcome as JSON.

    python -m autotune_cli.worker [--parent PID] JOB.json RESULT.json [STATUS.json]
    python -m autotune_cli.worker [--parent PID] --serve INBOX

The first form tunes one combo and exits (Slurm tasks, and the sweep's `--fresh-workers`).
In the second the worker stays warm: it waits for INBOX/job (JSON: the job, result, status
and log paths), tunes it with its output in that log, writes the result, and waits for the
next, so torch, helion and the kernels are imported once per GPU, not once per combo. The
sweep keeps one per GPU, pinned with CUDA_VISIBLE_DEVICES. A result file (entry or failure)
is the outcome; a worker that dies without one is a crash the parent records as a failure.
With --parent (the sweep's pid) the worker dies with the sweep (`die_with`).
A warm worker exits after a combo that produced no entry, so that whatever state a failure
left does not reach the next combo. A result with `context_lost` says a config broke the
CUDA context mid-search; the sweep may retry that combo in a fresh worker (see
sweep.isolated_retry).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import time
import traceback

# The signal on which the worker writes every thread's stack to its log; the sweep sends it
# to a worker it is about to kill for running past its timeout. Not SIGUSR1: on the H200 a
# SIGUSR1 sent to a worker hung in Triton's make_llir wrote nothing, most likely because
# LLVM (inside Triton) takes SIGUSR1 as its "info" signal once its handlers are installed.
# LLVM leaves the real-time signals alone. Not faulthandler's timer either: its watchdog thread reads the
# main thread's frames while they change, and on the CPU it crashed workers (SIGSEGV).
STACKS_SIGNAL: int | None = signal.SIGRTMIN + 4 if hasattr(signal, "SIGRTMIN") else None

_stacks_to: list[object] = []  # keeps the log's descriptor copy open for faulthandler


def start_seconds(job: dict[str, object]) -> dict[str, float]:
    """{'start': seconds from the parent's spawn (the job's `spawned_at`, wall clock) to now,
    the worker's imports done}; empty when the job does not say when it was spawned."""
    spawned = job.get("spawned_at")
    return {"start": max(0.0, time.time() - spawned)} if isinstance(spawned, (int, float)) else {}


def format_phases(phases: dict[str, float]) -> str:
    """'setup 9.1s, search 34.0s, ...' from a tune's phase seconds, in order."""
    return ", ".join(f"{name} {sec:.1f}s" for name, sec in phases.items())


def install_stack_dump() -> None:
    """On STACKS_SIGNAL, write every thread's stack to the log: fd 2 as it is now, through a
    descriptor of its own, since Helion points fd 2 at a temporary file while it compiles
    and runs configs (autotuner.logger.capture_output), which is when searches hang. Called
    again (a warm worker's next combo), it moves the dump to fd 2's new log."""
    if STACKS_SIGNAL is None:
        return
    log = os.fdopen(os.dup(2), "w")
    faulthandler.register(STACKS_SIGNAL, file=log, all_threads=True)
    for old in _stacks_to:
        old.close()  # type: ignore[attr-defined]
    _stacks_to[:] = [log]


def run_job(job_path: str, result_path: str, status_path: str | None) -> dict[str, object]:
    """Tune the job's combo and write its result file (atomically); returns the result."""
    with open(job_path) as f:
        job = json.load(f)
    from autotune_cli.spec import Budget, Tolerance
    from autotune_cli.tuner import ContextLost, TuneFailure, tune

    # Spawn (or, for a warm worker, hand-off) to here: the interpreter, torch, helion and the
    # kernels imported in a new worker; next to nothing in a warm one.
    start = start_seconds(job)
    result: dict[str, object]
    try:
        outcome = tune(job["kernel"], job["dims"], job["dtype"], Budget.model_validate(job["budget"]),
                       Tolerance.model_validate(job["tolerance"]), status_path=status_path,
                       warm_start=job.get("warm_start"), adopt=job.get("adopt"))
        phases = {**start, **dict(outcome.phases)}
        result = {
            "entry": None if outcome.entry is None else outcome.entry.model_dump(mode="json"),
            "failure": None if outcome.failure is None else outcome.failure.model_dump(mode="json"),
            "kernel": outcome.kernel.model_dump(mode="json"),
            "phases": phases,
        }
        # Into the combo's log too, where the sweep keeps one (--log-dir).
        print(f"phases: {format_phases(phases)}", file=sys.stderr, flush=True)
    except ContextLost as e:
        result = {"error": str(e), "context_lost": True}
    except TuneFailure as e:
        result = {"error": str(e)}
    except Exception as e:
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    tmp = f"{result_path}.tmp"
    # When the result was written: the parent times what follows (the worker's exit) from it.
    result["written_at"] = time.time()
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    return result


def die_with(parent: int) -> bool:
    """Have the kernel SIGKILL this worker when its parent, the sweep, dies, even by SIGKILL
    (Linux; elsewhere the serving loop's parent check is all). False when the parent is gone
    already: this worker's parent is not `parent` any more.

    Here, after exec, and not in a `preexec_fn` of the sweep's Popen: that runs Python in the
    forked child of a process with threads (the progress display), and on an H100 one such child
    hung before its exec (it had loaded libc with ctypes), and with it the sweep, in Popen, for good."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    return os.getppid() == parent


def main(argv: list[str]) -> int:
    if argv[:1] == ["--parent"]:
        if len(argv) < 3 or not argv[1].isdigit():
            print("usage: python -m autotune_cli.worker [--parent PID] (JOB RESULT [STATUS] | --serve INBOX)",
                  file=sys.stderr)
            return 2
        if not die_with(int(argv[1])):
            print(f"worker: its sweep (pid {argv[1]}) is gone; nothing run", file=sys.stderr)
            return 0
        argv = argv[2:]
    if argv[:1] == ["--serve"]:
        if len(argv) != 2:
            print("usage: python -m autotune_cli.worker --serve INBOX", file=sys.stderr)
            return 2
        return serve(argv[1])
    install_stack_dump()
    run_job(argv[0], argv[1], argv[2] if len(argv) > 2 else None)
    return 0


# A warm worker's hand-off file in its inbox, and how often it looks for one.
INBOX_JOB = "job"
POLL_S = 0.1


def serve(inbox: str) -> int:
    """Tune the jobs handed to INBOX one after another (see the module docstring); returns
    (exits) after a job that produced no entry (a failure or an error), or when its parent,
    the sweep, is gone (it kills its workers; on Linux the kernel does too if the sweep dies)."""
    parent = os.getppid()
    handoff = os.path.join(inbox, INBOX_JOB)
    while True:
        try:
            with open(handoff) as f:
                paths = json.load(f)
        except (OSError, ValueError):  # none yet, or not written whole (the sweep renames it in)
            if os.getppid() != parent:
                return 0
            time.sleep(POLL_S)
            continue
        os.unlink(handoff)
        _log_to(paths["log"])
        result = run_job(paths["job"], paths["result"], paths.get("status"))
        if result.get("entry") is None:
            # A failure or an error may have left CUDA or Helion in a bad state (a lost
            # context, a sticky launch error): the next combo gets a new worker.
            return 0
        _release_gpu_memory()


def _release_gpu_memory() -> None:
    """Give the GPU memory torch cached for the last combo back while the worker waits."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def _log_to(path: str) -> None:
    """Point fds 1 and 2 (Python's prints, Helion's logs, C-level output) and the stack dump
    at this job's log."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    install_stack_dump()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
