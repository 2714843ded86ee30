"""The local executor's progress on the console: a line per finished combo (with where its
time went), a status line for the running ones, the ETA."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.text import Text

from autotune_cli.plan import Combo, estimate_seconds_for
from autotune_cli.spec import Budget
from autotune_cli.sweep_job import describe_entry, fmt_s, worker_death
from autotune_cli.worker import format_phases
from mamba_tune.bundle import Entry, Failure


@dataclasses.dataclass
class RunningCombo:
    """A combo running in a worker process: the sweep starts, polls and reaps it; Progress shows it."""
    combo: Combo
    index: int
    slot: int | None
    proc: subprocess.Popen[bytes]
    workdir: Path
    log_path: Path
    started: float
    deadline: float
    isolated: bool = False
    # The worker serves further combos after this one (`worker.serve`); its inbox.
    inbox: Path | None = None
    # Its peak resident memory, read when the sweep reaps it (`exited`).
    maxrss_mb: float = 0.0

    def exited(self) -> bool:
        """Whether the worker exited; reaps it with wait4, which reports its peak memory."""
        if self.proc.returncode is not None:
            return True
        try:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            return self.proc.poll() is not None
        if not pid:
            return False
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        self.maxrss_mb = usage.ru_maxrss / 1024  # kilobytes on Linux
        return True

    def death(self) -> str:
        """How the worker, gone without a result, ended (`sweep_job.worker_death`)."""
        phase = self.status().get("phase")
        return worker_death(self.proc.pid, self.proc.returncode, phase if isinstance(phase, str) else None,
                            time.monotonic() - self.started, self.maxrss_mb)

    @property
    def result_path(self) -> Path:
        return self.workdir / "result.json"

    @property
    def status_path(self) -> Path:
        return self.workdir / "status.json"

    def status(self) -> dict[str, object]:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}


class Progress:
    """Progress on the console: a line per finished combo, a status line for the running
    ones (printed once a minute where the console is not a terminal), the ETA."""

    def __init__(self, console: Console, total: int, nslots: int, budget: Budget) -> None:
        self.console = console
        self.total = total
        self.nslots = nslots
        self.budget = budget
        self.t0 = time.monotonic()
        self.durations: list[float] = []
        self.finished = 0
        self.last_note = 0.0

    def eta(self) -> str:
        remaining = self.total - self.finished
        if not remaining:
            return "0m00s"
        # Until a combo finishes, the plan's estimate for this budget.
        per = (sum(self.durations) / len(self.durations)) if self.durations else estimate_seconds_for(self.budget)
        return fmt_s(per * remaining / self.nslots)

    def combo_done(self, run: RunningCombo, entry: Entry | None, failure: Failure | None, now: float,
                   phases: dict[str, float] | None = None) -> float:
        """Count a finished combo and print its line (with where its time went, when the
        worker said: `worker_phases`, and the rest: the sweep's polling and file handling);
        returns how long it took."""
        took = now - run.started
        self.durations.append(took)
        self.finished += 1
        head = f"[{self.finished}/{self.total}] {escape(run.combo.label())}"
        spent = ""
        if phases:
            spent = f" ({escape(format_phases(phases))}, rest {max(0.0, took - sum(phases.values())):.1f}s)"
        if entry is not None:
            self.console.print(f"{head}: [green]ok[/] {escape(describe_entry(entry))} in {fmt_s(took)}{spent}; "
                               f"elapsed {fmt_s(now - self.t0)}, ETA {self.eta()}")
        else:
            self.console.print(f"{head}: [red]FAILED[/] {escape(failure.reason if failure else '?')}{spent}; "
                               f"elapsed {fmt_s(now - self.t0)}, ETA {self.eta()}")
        return took

    def show(self, status: Status, running: list[RunningCombo], now: float) -> None:
        """The status line: each running combo's phase, time and best so far."""
        parts = []
        for run in running:
            st = run.status()
            best = st.get("best_ms")
            parts.append(
                f"{run.combo.kernel} {st.get('phase', 'starting')} {fmt_s(now - run.started)}"
                + (f" best {best:.4f} ms" if isinstance(best, (int, float)) else "")
                + (f" ({st['configs']} configs)" if st.get("configs") else ""))
        line = (f"[{self.finished}/{self.total}] elapsed {fmt_s(now - self.t0)} ETA {self.eta()} | "
                + "; ".join(parts))
        status.update(Text(line))  # plain text: the status file is a worker's data
        if not self.console.is_terminal and now - self.last_note > 60:
            self.console.print(line, markup=False)
            self.last_note = now
