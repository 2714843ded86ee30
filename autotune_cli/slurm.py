"""The Slurm executor: a sweep's missing combos as one Slurm job array, through submitit.

Layout, next to the bundle `<out>/<sku>/<spec>.json`:

    <out>/<sku>/<spec>.slurm/state.json        what was submitted: per combo its attempts (job ids, outcome)
    <out>/<sku>/<spec>.slurm/logs/              submitit's folder: sbatch scripts, %A_%a logs
    <out>/<sku>/<spec>.slurm/combos/<id>/       one combo: task.json, job.json (the worker's job),
                                                result.json (the worker's result), merged.json

Each array task runs `autotune_cli.slurm_task.run_task(<combo dir>)`: it exits early when the key
is already in the bundle, else runs the local executor's worker (`python -m autotune_cli.worker`,
with the job file `SweepJob.worker_job` writes for both executors) and merges the result into the
bundle under the bundle's lock, then writes merged.json. A task killed after its result was written is
merged by `collect` (and by a waiting sweep). A task that ended without a result (preempted, out of
time, node lost, killed) is recorded with Slurm's reason and submitted once more.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import math
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

from filelock import FileLock
from rich.console import Console
from rich.markup import escape

from autotune_cli import environment as env
from autotune_cli.plan import Combo
from autotune_cli.slurm_task import merge_result, read_json, run_task
from autotune_cli.sweep_job import (
    ComboResult,
    SweepInputError,
    SweepJob,
    SweepResult,
    bundle_path_for,
    describe_entry,
    fmt_s,
    stale_keys,
)
from mamba_tune.bundle import (
    Bundle,
    BundleError,
    Entry,
    Failure,
    load_bundle,
)

STATE_FILE = "state.json"
# Slurm states in which a task is still queued or running.
ACTIVE_STATES = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT"}
MAX_ATTEMPTS = 2  # the first submission and one retry


class SlurmError(Exception):
    """sbatch refused the array, or Slurm cannot be reached: exit code 2."""


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    gpus_per_task: int | None = None  # None: 1, or 0 for a CPU dry run
    max_parallel: int = 64
    extra: dict[str, str] = dataclasses.field(default_factory=dict)
    wait: bool = True
    poll_s: float = 2.0


def private_dir(path: Path) -> Path:
    """Make `path` a folder only this user can enter (0700): submitit's pickled tasks, which
    the array's tasks unpickle and run, live under it, and -o may be writable by others.
    A folder (or link) of another user there is SweepInputError."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise SweepInputError(f"{path}: not a folder of this user (uid {os.getuid()}); the Slurm tasks' "
                              "pickles must live where only their owner can write: remove it or use another -o")
    os.chmod(path, 0o700)
    return path


def slurm_dir_for(bundle_path: Path) -> Path:
    return bundle_path.with_suffix(".slurm")


def combo_dir_name(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()[:16]


def time_limit_minutes(seconds: float) -> int:
    return max(1, math.ceil(seconds / 60))


# --- the state file ---------------------------------------------------------------------

def load_state(slurm_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((slurm_dir / STATE_FILE).read_text())
    except FileNotFoundError:
        return {"combos": {}, "arrays": []}


def save_state(slurm_dir: Path, state: dict[str, Any]) -> None:
    tmp = slurm_dir / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
    os.replace(tmp, slurm_dir / STATE_FILE)


# --- Slurm's view -----------------------------------------------------------------------

def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def queued(job_ids: set[str]) -> dict[str, str]:
    """Tasks still in the queue: job id ('123_4' or '123') -> Slurm state."""
    try:
        r = _run(["squeue", "-h", "-r", "-u", getpass.getuser(), "-o", "%i|%T"])
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"squeue failed: {e}") from None
    if r.returncode != 0:
        raise SlurmError(f"squeue failed: {' '.join(r.stderr.split())}")
    found: dict[str, str] = {}
    for line in r.stdout.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid in job_ids:
            found[jid] = state
    return found


def final_state(job_id: str, folder: Path) -> str:
    """How a task that left the queue ended, in Slurm's words: scontrol (jobs that ended within
    MinJobAge), else sacct through submitit, else 'UNKNOWN'; plus slurmstepd's line from the
    task's log ('*** JOB 12 ON node CANCELLED AT ... DUE TO TIME LIMIT ***') when there is one."""
    text = "UNKNOWN"
    try:
        r: subprocess.CompletedProcess[str] | None = _run(["scontrol", "-o", "show", "job", job_id])
    except (OSError, subprocess.TimeoutExpired):
        r = None
    if r is not None and r.returncode == 0 and r.stdout.strip():
        fields = dict(f.split("=", 1) for f in r.stdout.split() if "=" in f)
        text = fields.get("JobState", "UNKNOWN")
        if fields.get("Reason") not in (None, "None"):
            text += f" reason {fields['Reason']}"
        if fields.get("ExitCode") not in (None, "0:0"):
            text += f" ExitCode {fields['ExitCode']}"
    else:
        import submitit

        try:
            text = str(submitit.SlurmJob(folder=folder, job_id=job_id).state)
        except Exception:  # submitit's watcher: sacct missing or accounting disabled
            pass
    try:
        lines = task_log(folder, job_id).read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    # slurmstepd's "*** JOB 12 ON node CANCELLED AT ... DUE TO TIME LIMIT ***", and submitit's
    # "Caught signal SIGUSR2 on node: this job is timed-out." (the warning Slurm sends before the limit).
    said = [ln.split("***")[1].strip() for ln in lines if ln.count("***") >= 2 and "JOB" in ln]
    said += [ln.split(" - ", 1)[-1].strip() for ln in lines if "this job is timed-out" in ln
             or "this job is preempted" in ln]
    return text + (f": {'; '.join(said[-2:])}" if said else "")


def task_log(folder: Path, job_id: str) -> Path:
    return folder / f"{job_id}_0_log.err"


# --- submitting and waiting ---------------------------------------------------------------

class SlurmSweep:
    """Submit a sweep's missing combos as one array; by default wait for it with progress."""

    def __init__(self, job: SweepJob, options: SlurmOptions, console: Console) -> None:
        self.job = job
        self.opt = options
        self.console = console
        sku = "cpu" if job.options.cpu_dry_run else job.target_sku
        self.bundle_path = bundle_path_for(job.options.out_dir, sku, job.bundle_name)
        self.dir = slurm_dir_for(self.bundle_path)
        self.logs = self.dir / "logs"
        self.by_key = {c.key: c for c in job.combos}

    # The bundle as the submitter sees it.
    def _bundle(self) -> tuple[Bundle | None, set[str]]:
        if self.job.options.cpu_dry_run:
            return self.job.existing(self.bundle_path, env.CPU_DRY_RUN_GPU, env.versions(with_driver=False),
                                     self.console)
        if not self.bundle_path.exists():
            return None, set()
        try:
            bundle = load_bundle(self.bundle_path)
        except BundleError as e:
            raise SweepInputError(f"cannot resume: {e}; fix it, move it away, or choose another -o") from None
        stale: set[str] = set()
        for keys in stale_keys(bundle).values():
            stale |= keys
        return bundle, stale

    def _time_limit_s(self) -> float:
        return self.job.timeout_s()

    def _executor(self) -> Any:
        try:
            import submitit
        except ImportError:
            raise SweepInputError("--executor slurm needs submitit: pip install 'mamba-tune[slurm]'") from None
        ex = submitit.SlurmExecutor(folder=self.logs, max_num_timeout=0)
        gpus = self.opt.gpus_per_task
        if gpus is None:
            gpus = 0 if self.job.options.cpu_dry_run else 1
        params: dict[str, Any] = {
            "job_name": f"mamba-tune-{self.job.bundle_name}",
            "time": time_limit_minutes(self._time_limit_s()),
            # Slurm's warning (USR2) before the limit: submitit ends the task on it (recorded, retried once).
            "signal_delay_s": int(max(10, min(90, self._time_limit_s() / 4))),
            "array_parallelism": self.opt.max_parallel,
            "ntasks_per_node": 1,
            "setup": [f"export PYTHONPATH={Path(__file__).resolve().parent.parent}${{PYTHONPATH:+:$PYTHONPATH}}"],
        }
        if gpus:
            params["gpus_per_task"] = gpus
        if self.opt.partition:
            params["partition"] = self.opt.partition
        if self.opt.account:
            params["account"] = self.opt.account
        if self.opt.extra:
            params["additional_parameters"] = dict(self.opt.extra)
        ex.update_parameters(**params)
        return ex

    def _prepare(self, combo: Combo, bundle: Bundle | None, warm_bundles: list[Bundle]) -> Path:
        d = self.dir / "combos" / combo_dir_name(combo.key)
        d.mkdir(parents=True, exist_ok=True)
        for name in ("result.json", "result.json.worker", "merged.json", "status.json"):
            (d / name).unlink(missing_ok=True)
        j, o = self.job, self.job.options
        (d / "job.json").write_text(json.dumps(j.worker_job(combo, [*filter(None, [bundle]), *warm_bundles],
                                                            warm_bundles)))
        task = {"key": combo.key, "label": combo.label(), "kernel": combo.kernel, "dims": combo.dims,
                "dtype": combo.dtype, "bundle": str(self.bundle_path.resolve()),
                "cpu_dry_run": o.cpu_dry_run, "target_sku": j.target_sku,
                "allow_gpu_mismatch": o.allow_gpu_mismatch, "force": o.force,
                "spec": j.spec_ref.model_dump(mode="json") if j.spec_ref else None}
        (d / "task.json").write_text(json.dumps(task))
        return d

    def _submit(self, combos: list[Combo], bundle: Bundle | None, state: dict[str, Any], why: str) -> str:
        dirs = [str(self._prepare(c, bundle, self._warm_bundles()).resolve()) for c in combos]
        ex = self._executor()
        try:
            jobs = ex.map_array(run_task, dirs)
        except Exception as e:  # submitit raises FailedJobError / subprocess errors for sbatch refusals
            raise SlurmError(f"sbatch failed: {' '.join(str(e).split())[:400]}") from None
        array_id = jobs[0].job_id.split("_")[0]
        state.setdefault("arrays", []).append({"id": array_id, "tasks": len(jobs), "at": env.now(), "why": why})
        for combo, job in zip(combos, jobs):
            rec = state["combos"].setdefault(combo.key, {"label": combo.label(), "attempts": []})
            rec["attempts"].append({"job_id": job.job_id, "submitted": env.now(), "state": "SUBMITTED",
                                    "retry": why == "retry"})
        save_state(self.dir, state)
        return array_id

    def _warm_bundles(self) -> list[Bundle]:
        return self.job.warm_bundles(self.bundle_path.parent.name)

    def run(self) -> SweepResult:
        # Bad input (the bundle to resume, a --warm-start bundle) fails before anything is written.
        bundle, stale = self._bundle()
        warm = self._warm_bundles()
        private_dir(self.dir)
        private_dir(self.logs)
        todo, results = self.job.todo(bundle, stale)
        with FileLock(str(self.dir / f"{STATE_FILE}.lock"), timeout=60):
            state = load_state(self.dir)
            active = self._active(state)
            in_flight = [c for c in todo if c.key in active]
            submit = [c for c in todo if c.key not in active]
            self.console.print(
                f"sweep {self.job.bundle_name} (slurm): {len(self.job.combos)} combos, {len(results)} already in "
                f"{self.bundle_path}, {len(in_flight)} still queued or running, {len(submit)} to submit"
                f"{self.job.adoption_note(submit, warm)}")
            if submit:
                array_id = self._submit(submit, bundle, state, "sweep")
                self.console.print(
                    f"submitted job array {array_id}: {len(submit)} tasks, at most {self.opt.max_parallel} at "
                    f"a time, time limit {time_limit_minutes(self._time_limit_s())} min each; logs in {self.logs}")
        if not self.opt.wait:
            if submit:
                print(array_id, flush=True)
            self.console.print(f"not waiting: `mamba-tune status {self.bundle_path}` shows progress, "
                               f"`mamba-tune collect {self.bundle_path}` merges finished results")
            return SweepResult(self.bundle_path, results)
        return SweepResult(self.bundle_path, results + self.wait([*in_flight, *submit]))

    def _active(self, state: dict[str, Any]) -> set[str]:
        """Keys whose last attempt is still queued or running."""
        last = {k: r["attempts"][-1]["job_id"] for k, r in state["combos"].items() if r["attempts"]}
        if not last:
            return set()
        q = queued(set(last.values()))
        return {k for k, jid in last.items() if jid in q}

    def wait(self, combos: list[Combo]) -> list[ComboResult]:
        """Poll until every combo is merged, failed for good or cancelled; retry dead tasks once."""
        pending = {c.key: c for c in combos}
        results: list[ComboResult] = []
        t0 = time.monotonic()
        total = len(pending)
        last_note = 0.0
        with self.console.status("") as status:
            while pending:
                with FileLock(str(self.dir / f"{STATE_FILE}.lock"), timeout=60):
                    state = load_state(self.dir)
                    ended = self.poll(state, set(pending))
                    save_state(self.dir, state)
                now = time.monotonic()
                for key, (entry, failure, line) in ended.items():
                    combo = pending.pop(key)
                    results_line = f"[{total - len(pending)}/{total}] {combo.label()}: {line}; elapsed " \
                                   f"{fmt_s(now - t0)}, ETA {_eta(now - t0, total - len(pending), len(pending))}"
                    self.console.print(results_line)
                    if entry is not None or failure is not None:
                        results.append(ComboResult(combo, entry, failure, now - t0))
                counts = _count(state, pending)
                line = (f"[{total - len(pending)}/{total}] elapsed {fmt_s(now - t0)} ETA "
                        f"{_eta(now - t0, total - len(pending), len(pending))} | "
                        + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))
                status.update(line)
                if pending and not self.console.is_terminal and now - last_note > 60:
                    self.console.print(line)  # logs and pipes get the status line once a minute
                    last_note = now
                if pending:
                    time.sleep(self.opt.poll_s)
        return results

    def poll(self, state: dict[str, Any], keys: set[str]) -> dict[str, tuple[Entry | None, Failure | None, str]]:
        """Look at each key's last attempt; merge results, record deaths, retry once. Returns the
        keys that ended for good: key -> (entry, failure, line to print)."""
        last = {k: state["combos"][k]["attempts"][-1] for k in keys if state["combos"].get(k, {}).get("attempts")}
        q = queued({a["job_id"] for a in last.values()})
        ended: dict[str, tuple[Entry | None, Failure | None, str]] = {}
        retry: list[Combo] = []
        dead: list[str] = []
        for key, attempt in last.items():
            jid = attempt["job_id"]
            if jid in q:
                attempt["state"] = q[jid]
                continue
            d = self.dir / "combos" / combo_dir_name(key)
            merged = read_json(d / "merged.json")
            if merged is None and read_json(d / "result.json") is not None:
                merged = merge_result(d, str(task_log(self.logs, jid)))
                merged["collected"] = True
            if merged is not None:
                attempt["state"] = "DONE"
                attempt["outcome"] = merged["outcome"]
                ended[key] = self._outcome(key, merged)
                continue
            attempt["state"] = "DIED"
            attempt["reason"] = final_state(jid, self.logs)
            dead.append(key)
        # scancel of a whole array (every task of it still unfinished ended CANCELLED at once) is the
        # user's: no retry. One task killed, preempted, out of time or on a lost node: retried once.
        by_array: dict[str, list[str]] = {}
        for key in dead:
            by_array.setdefault(last[key]["job_id"].split("_")[0], []).append(key)
        for array_id, keys_ in by_array.items():
            others = [a for k, a in last.items() if a["job_id"].split("_")[0] == array_id and k not in keys_
                      and a["state"] not in ("DONE",)]
            whole = len(keys_) > 1 and not others and all(last[k]["reason"].startswith("CANCELLED") for k in keys_)
            for key in keys_:
                self._died(key, last[key], whole, state, ended, retry)
        if retry:
            bundle, _ = self._bundle()
            array_id = self._submit(retry, bundle, state, "retry")
            self.console.print(f"resubmitted {len(retry)} task(s) as job {array_id}")
        return ended

    def _died(self, key: str, attempt: dict[str, Any], whole_array_cancelled: bool, state: dict[str, Any],
              ended: dict[str, tuple[Entry | None, Failure | None, str]], retry: list[Combo]) -> None:
        jid, reason = attempt["job_id"], attempt["reason"]
        log = task_log(self.logs, jid)
        if whole_array_cancelled:
            ended[key] = (None, None, f"[yellow]cancelled[/] ({escape(reason)}); rerun the sweep to resume")
        elif not attempt.get("retry"):
            self.console.print(f"[yellow]{state['combos'][key]['label']}: task {jid} ended without a result "
                               f"({escape(reason)}; log: {log}); retrying once")
            retry.append(self.by_key[key])
        else:
            failure = self._record_failure(key, f"Slurm task {jid} ended without a result twice: {reason}", log)
            ended[key] = (None, failure, f"[red]FAILED[/] {escape(failure.reason)}")

    def _outcome(self, key: str, merged: dict[str, Any]) -> tuple[Entry | None, Failure | None, str]:
        bundle = load_bundle(self.bundle_path) if self.bundle_path.exists() else None
        entry = bundle.entries.get(key) if bundle else None
        failure = bundle.failures.get(key) if bundle else None
        kind = merged["outcome"]
        if kind == "error":
            f = Failure(kernel=self.by_key[key].kernel, dims=self.by_key[key].dims, dtype=self.by_key[key].dtype,
                        reason=merged.get("reason", "?"), at=env.now())
            return None, f, f"[red]NOT MERGED[/] {escape(str(merged.get('reason')))}"
        if entry is not None:
            return entry, None, f"[green]ok[/] {describe_entry(entry)}" + (" (already in the bundle)"
                                                                           if kind == "kept" else "")
        return None, failure, f"[red]FAILED[/] {escape(failure.reason if failure else merged.get('reason', '?'))}"

    def _record_failure(self, key: str, reason: str, log: Path) -> Failure:
        combo = self.by_key[key]
        failure = Failure(kernel=combo.kernel, dims=combo.dims, dtype=combo.dtype, reason=f"{reason} (log: {log})",
                          at=env.now())
        d = self.dir / "combos" / combo_dir_name(key)
        tmp = d / ".result.json.tmp"
        tmp.write_text(json.dumps({"error": reason}))
        os.replace(tmp, d / "result.json")
        merge_result(d, str(log))
        return failure


def _eta(elapsed: float, finished: int, remaining: int) -> str:
    """From the array's throughput so far; unknown before the first combo ends."""
    if not remaining:
        return "0m00s"
    return fmt_s(elapsed / finished * remaining) if finished else "?"


def _count(state: dict[str, Any], pending: dict[str, Combo]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in pending:
        attempts = state["combos"].get(key, {}).get("attempts") or [{"state": "?"}]
        st = attempts[-1]["state"].lower()
        counts[st] = counts.get(st, 0) + 1
    return counts


# --- status and collect, from the state folder alone ----------------------------------------

def find_slurm_dirs(path: Path) -> list[Path]:
    """The `<spec>.slurm` folders for a bundle file, a `.slurm` folder, or a folder of bundles."""
    if path.suffix == ".slurm" and path.is_dir():
        return [path]
    if path.is_file() or path.suffix == ".json":
        d = slurm_dir_for(path)
        return [d] if d.is_dir() else []
    return sorted(p for p in path.rglob("*.slurm") if p.is_dir() and (p / STATE_FILE).exists())


@dataclasses.dataclass
class ComboStatus:
    key: str
    label: str
    status: str  # done | failed | pending | running | died | cancelled | not merged
    job_id: str
    attempts: int
    detail: str


def combo_statuses(slurm_dir: Path) -> list[ComboStatus]:
    state = load_state(slurm_dir)
    last = {k: r["attempts"][-1] for k, r in state["combos"].items() if r["attempts"]}
    q = queued({a["job_id"] for a in last.values()})
    bundle_path = slurm_dir.with_suffix(".json")
    bundle = load_bundle(bundle_path) if bundle_path.exists() else None
    rows: list[ComboStatus] = []
    for key, rec in sorted(state["combos"].items(), key=lambda kv: kv[1]["label"]):
        attempt = last.get(key)
        if attempt is None:
            continue
        jid = attempt["job_id"]
        d = slurm_dir / "combos" / combo_dir_name(key)
        n = len(rec["attempts"])
        if bundle is not None and key in bundle.entries:
            e = bundle.entries[key]
            rows.append(ComboStatus(key, rec["label"], "done", jid, n, f"{e.timing.tuned_ms:.4f} ms"))
        elif jid in q:
            st = q[jid].lower()
            st = st if st in ("pending", "running") else f"running ({st})"
            rows.append(ComboStatus(key, rec["label"], st, jid, n, ""))
        elif bundle is not None and key in bundle.failures and (d / "merged.json").exists():
            rows.append(ComboStatus(key, rec["label"], "failed", jid, n, bundle.failures[key].reason))
        elif (d / "result.json").exists():
            rows.append(ComboStatus(key, rec["label"], "not merged", jid, n, "result written: `mamba-tune collect`"))
        else:
            reason = attempt.get("reason") or final_state(jid, slurm_dir / "logs")
            kind = "cancelled" if reason.startswith("CANCELLED") else "died"
            rows.append(ComboStatus(key, rec["label"], kind, jid, n,
                                    f"{reason} (log: {task_log(slurm_dir / 'logs', jid)})"))
    return rows


def collect(slurm_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """Merge every result written but not merged (a task killed between the two). Returns
    (label, merged.json) per merged combo."""
    state = load_state(slurm_dir)
    merged: list[tuple[str, dict[str, Any]]] = []
    for key, rec in sorted(state["combos"].items()):
        d = slurm_dir / "combos" / combo_dir_name(key)
        if (d / "result.json").exists() and not (d / "merged.json").exists():
            jid = rec["attempts"][-1]["job_id"] if rec["attempts"] else ""
            merged.append((rec["label"], merge_result(d, str(task_log(slurm_dir / "logs", jid)))))
    return merged
