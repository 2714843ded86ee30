"""Worker process: tune one combo and write the outcome as JSON.

    python -m autotune_cli.worker JOB.json RESULT.json [STATUS.json]

The sweep starts one worker per combo, pinned to one GPU with CUDA_VISIBLE_DEVICES.
Exit code 0 with a result file (entry or failure); anything else is a crash the parent
records as a failure. A result with `context_lost` says a config broke the CUDA context
mid-search; the sweep may retry the combo in a fresh worker (see sweep.isolated_retry).
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
    and runs configs (autotuner.logger.capture_output), which is when searches hang."""
    if STACKS_SIGNAL is None or _stacks_to:
        return
    log = os.fdopen(os.dup(2), "w")
    _stacks_to.append(log)
    faulthandler.register(STACKS_SIGNAL, file=log, all_threads=True)


def main(argv: list[str]) -> int:
    install_stack_dump()
    job_path, result_path = argv[0], argv[1]
    status_path = argv[2] if len(argv) > 2 else None
    with open(job_path) as f:
        job = json.load(f)
    from autotune_cli.spec import Budget, Tolerance
    from autotune_cli.tuner import ContextLost, TuneFailure, tune

    # The process's start (interpreter, torch, helion and the kernels imported): what a worker
    # kept warm between combos would save.
    start = start_seconds(job)
    try:
        outcome = tune(job["kernel"], job["dims"], job["dtype"], Budget.model_validate(job["budget"]),
                       Tolerance.model_validate(job["tolerance"]), status_path=status_path,
                       warm_start=job.get("warm_start"))
        result = {
            "entry": None if outcome.entry is None else outcome.entry.model_dump(mode="json"),
            "failure": None if outcome.failure is None else outcome.failure.model_dump(mode="json"),
            "kernel": outcome.kernel.model_dump(mode="json"),
            "phases": {**start, **dict(outcome.phases)},
        }
        # Into the combo's log too, where the sweep keeps one (--log-dir).
        print(f"phases: {format_phases(result['phases'])}", file=sys.stderr, flush=True)
    except ContextLost as e:
        result = {"error": str(e), "context_lost": True}
    except TuneFailure as e:
        result = {"error": str(e)}
    except Exception as e:
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    tmp = f"{result_path}.tmp"
    # When the result was written: the parent times the worker's exit from it.
    result["written_at"] = time.time()
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
