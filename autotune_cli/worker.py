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
import sys
import traceback

# The log, as a descriptor of its own: Helion points fd 2 at a temporary file while it
# compiles and runs configs (autotuner.logger.capture_output), which is when searches hang.
_LOG = os.fdopen(os.dup(2), "w")


def arm_stack_dump(timeout_s: float | None) -> float | None:
    """Write every thread's stack to the log shortly before the sweep's deadline (10 s, or
    half the timeout if shorter), so a worker that the sweep kills says where it was.

    faulthandler's watchdog thread does it, with no signal: on the H200 a SIGUSR1 handler
    (faulthandler.register) wrote nothing from a worker hung in Triton's make_llir, most
    likely because LLVM's own signal handling, once installed, takes SIGUSR1 (its "info"
    signal). This timer wrote the stacks of the same hang. Returns the delay armed."""
    if not timeout_s or timeout_s <= 0:
        return None
    delay = timeout_s - min(10.0, timeout_s / 2)
    faulthandler.dump_traceback_later(delay, file=_LOG)
    return delay


def main(argv: list[str]) -> int:
    job_path, result_path = argv[0], argv[1]
    status_path = argv[2] if len(argv) > 2 else None
    with open(job_path) as f:
        job = json.load(f)
    arm_stack_dump(job.get("timeout_s"))
    from autotune_cli.spec import Budget, Tolerance
    from autotune_cli.tuner import ContextLost, TuneFailure, tune

    try:
        outcome = tune(job["kernel"], job["dims"], job["dtype"], Budget.model_validate(job["budget"]),
                       Tolerance.model_validate(job["tolerance"]), status_path=status_path,
                       warm_start=job.get("warm_start"))
        result = {
            "entry": None if outcome.entry is None else outcome.entry.model_dump(mode="json"),
            "failure": None if outcome.failure is None else outcome.failure.model_dump(mode="json"),
            "kernel": outcome.kernel.model_dump(mode="json"),
        }
    except ContextLost as e:
        result = {"error": str(e), "context_lost": True}
    except TuneFailure as e:
        result = {"error": str(e)}
    except Exception as e:
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {e}"}
    tmp = f"{result_path}.tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, result_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
