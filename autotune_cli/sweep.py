"""Run a sweep: combos spread over GPUs, one worker process per GPU kept warm between combos
(or one per combo: --fresh-workers), every result written at once.

The bundle is rewritten atomically after each combo, so a crashed or killed sweep loses at
most the combos in flight; rerunning the same command skips what is already in the bundle
(unless --force). One sweep at a time may write a bundle: a file lock (`<bundle>.lock`)
is held for the whole run.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from glob import escape as glob_escape
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.status import Status
from rich.text import Text

from autotune_cli import environment as env
from autotune_cli.bundle_lock import BundleBusy, bundle_lock
from autotune_cli.plan import Combo, estimate_seconds_for
from autotune_cli.search_trace import seconds_to_within
from autotune_cli.spec import Budget, Tolerance
from autotune_cli.tuning import all_kernels
from autotune_cli.warm_start import warm_configs
from autotune_cli.worker import INBOX_JOB, STACKS_SIGNAL, format_phases
from mamba_tune.bundle import (
    Bundle,
    BundleError,
    Entry,
    Failure,
    GpuInfo,
    KernelProvenance,
    Provenance,
    SpecRef,
    Versions,
    load_bundle,
    temp_prefix,
    write_bundle,
)
from mamba_tune.sku import GPU_SKUS


class SweepInputError(Exception):
    """Bad input or environment: exit code 2, nothing written."""


class SweepTerminated(BaseException):
    """SIGTERM or SIGHUP stopped the sweep (after its workers were stopped and its finished
    entries kept); like KeyboardInterrupt, not an Exception, so no handler swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.reported = False  # the sweep printed what it kept

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        """128 + the signal's number, as a shell reports a process the signal killed."""
        return 128 + self.signum


# Signals that stop a sweep the way Ctrl-C does (SIGINT raises KeyboardInterrupt, by the same rule).
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)

# The sweep's temp folder: TMPDIR/mamba-tune-sweep-<pid>-XXXX, the pid naming its owner.
TMP_PREFIX = "mamba-tune-sweep-"


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    out_dir: Path
    force: bool = False
    gpus: list[int] | None = None
    allow_gpu_mismatch: bool = False
    cpu_dry_run: bool = False
    log_dir: Path = Path(".mamba-tune/logs")
    timeout_s: float | None = None
    # Only part of the spec's combos (--kernel / --origin): the rest of the bundle must stay.
    partial: bool = False
    # Bundles whose entries seed the searches too (--warm-start), beside the one being written.
    warm_start: tuple[Path, ...] = ()
    # A new worker process per combo (--fresh-workers) instead of one kept warm per GPU.
    fresh_workers: bool = False


@dataclasses.dataclass
class ComboResult:
    combo: Combo
    entry: Entry | None
    failure: Failure | None
    seconds: float
    skipped: bool = False


@dataclasses.dataclass
class SweepResult:
    bundle_path: Path
    results: list[ComboResult]

    @property
    def failed(self) -> list[ComboResult]:
        return [r for r in self.results if r.failure is not None]


def bundle_path_for(out_dir: Path, sku: str, name: str) -> Path:
    """OUT/SKU/NAME.json; a name that could leave OUT (`spec.name_problem`) is SweepInputError."""
    from autotune_cli.spec import name_problem

    if why := name_problem(name):
        raise SweepInputError(f"bundle name {why}")
    return out_dir / sku / f"{name}.json"


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    # Linux: SIGKILL the worker when the sweep process dies, even by SIGKILL.
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _fmt_s(seconds: float) -> str:
    seconds = max(0, int(seconds))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def describe_entry(e: Entry) -> str:
    t = e.timing
    text = f"{t.tuned_ms:.4f} ms (default {t.default_ms:.4f} ms, {e.speedup.vs_default:.2f}x"
    if t.baseline_ms is not None and e.speedup.vs_baseline is not None:
        text += f"; {t.baseline} {t.baseline_ms:.4f} ms, {e.speedup.vs_baseline:.2f}x"
    within = seconds_to_within(e.search.trace or [], 1.0)
    if within is not None:
        text += f"; the search within 1% of its best at {within:.0f} s of {e.search.seconds:.0f} s"
    return text + ")"


# Helion runs a config first in its own process only in this precompile mode.
ISOLATED_ENV = ("HELION_AUTOTUNE_PRECOMPILE", "spawn")


def isolated_retry(result: dict[str, Any], isolated: bool, environ: dict[str, str] | os._Environ[str]) -> bool:
    """Retry a combo in a fresh worker with spawn precompile? Yes when a config broke the
    worker's CUDA context mid-search (the worker says `context_lost`) and the crashed run
    was not already isolated: in spawn mode every config runs first in a child process,
    and one that crashes there is skipped instead of ending the search."""
    name, value = ISOLATED_ENV
    return bool(result.get("context_lost")) and not isolated and environ.get(name) != value


@dataclasses.dataclass
class _Running:
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


@dataclasses.dataclass
class _Idle:
    """A warm worker between combos (`worker.serve`), waiting on its inbox."""
    proc: subprocess.Popen[bytes]
    inbox: Path


class Sweep:
    def __init__(
        self,
        combos: list[Combo],
        *,
        budget: Budget,
        tolerances: dict[str, Tolerance],
        target_sku: str,
        bundle_name: str,
        spec_ref: SpecRef | None,
        options: SweepOptions,
        console: Console,
    ) -> None:
        self.combos = combos
        self.budget = budget
        self.tolerances = tolerances
        self.target_sku = target_sku
        self.bundle_name = bundle_name
        self.spec_ref = spec_ref
        self.opt = options
        self.console = console
        # Warm workers between combos, by GPU slot (`_start`, `_reap`).
        self._idle: dict[int | None, _Idle] = {}
        # Names this run's worker logs: YYYYmmdd-HHMMSS-<pid> (`_start`).
        self._run_stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"

    # --- environment and bundle -------------------------------------------------------

    def _environment(self) -> tuple[GpuInfo, Versions, list[int | None]]:
        if self.opt.cpu_dry_run:
            return env.CPU_DRY_RUN_GPU, env.versions(with_driver=False), [None]
        count = env.cuda_device_count()
        if count == 0:
            raise SweepInputError(
                "no CUDA GPU on this machine: `mamba-tune sweep` tunes on the GPU it runs on. "
                "Run `mamba-tune plan SPEC` here to list the combos and the time estimate"
            )
        gpus = self.opt.gpus if self.opt.gpus is not None else list(range(count))
        bad = [g for g in gpus if not 0 <= g < count]
        if bad or not gpus:
            raise SweepInputError(f"--gpus {bad or gpus}: this machine has GPUs 0..{count - 1}")
        infos = {g: env.gpu_info(g) for g in gpus}
        names = {i.name for i in infos.values()}
        if len(names) > 1:
            raise SweepInputError(f"--gpus mixes GPU models ({', '.join(sorted(names))}): one sweep, one SKU")
        gpu = infos[gpus[0]]
        want = GPU_SKUS[self.target_sku]
        if (gpu.sku != want.sku or gpu.arch != want.arch) and not self.opt.allow_gpu_mismatch:
            raise SweepInputError(
                f"the spec targets {want.sku} ({want.arch}) but this GPU is {gpu.name} ({gpu.arch}); "
                "pass --allow-gpu-mismatch to tune for this GPU anyway"
            )
        return gpu, env.versions(), list(gpus)

    def _existing(self, path: Path, gpu: GpuInfo, versions: Versions) -> tuple[Bundle | None, set[str]]:
        """The bundle to resume, and the keys in it that must be re-tuned (stale)."""
        bundle = self._resumable(path, gpu, versions)
        if bundle is None:
            return None, set()
        planned = {c.key for c in self.combos}
        if not _same_versions(bundle.provenance.versions, versions):
            # Only with --force on the whole spec (`_resumable` refuses the rest).
            for key in sorted(set(bundle.entries) - planned):
                self.console.print(f"[yellow]dropping {escape(key)}: tuned with other versions and not in this spec")
            bundle = bundle.model_copy(update={
                "entries": {k: v for k, v in bundle.entries.items() if k in planned},
                "failures": {k: v for k, v in bundle.failures.items() if k in planned},
            })
        stale: set[str] = set()
        for name, keys in _stale_keys(bundle).items():
            self.console.print(f"[yellow]{escape(f'{name} changed since {path} was tuned')}: {len(keys)} entries are stale")
            stale |= keys
            # Stale entries outside this spec would keep a provenance that no longer holds.
            drop = keys - planned
            if drop:
                for key in sorted(drop):
                    self.console.print(f"[yellow]dropping stale {escape(key)}: not in this spec")
                bundle = bundle.model_copy(
                    update={"entries": {k: v for k, v in bundle.entries.items() if k not in drop}})
        # (With --force every combo is re-tuned anyway; a CPU dry run records ref-mode
        # placeholders, which no compiled kernel would take.)
        if not self.opt.force and not self.opt.cpu_dry_run:
            for key, why in _rejected_configs(bundle, planned - stale).items():
                self.console.print(f"[yellow]{escape(key)}: Helion rejects its config ({escape(why)}); re-tuning it")
                stale.add(key)
        return bundle, stale

    def _resumable(self, path: Path, gpu: GpuInfo, versions: Versions) -> Bundle | None:
        """The bundle at `path` if this run may resume it (None: there is none); else SweepInputError."""
        if not path.exists():
            return None
        try:
            bundle = load_bundle(path)
        except BundleError as e:
            raise SweepInputError(f"cannot resume: {e}; fix it, move it away, or choose another -o") from None
        old = bundle.provenance.gpu
        if (old.name, old.compute_capability) != (gpu.name, gpu.compute_capability):
            raise SweepInputError(
                f"{path} was tuned on {old.name} (sm {old.compute_capability}); this is {gpu.name} "
                f"(sm {gpu.compute_capability}): use another -o"
            )
        ov = bundle.provenance.versions
        if not _same_versions(ov, versions):
            tuned_with = (f"{path} was tuned with helion {ov.helion}, torch {ov.torch}, triton {ov.triton}; this is "
                          f"helion {versions.helion}, torch {versions.torch}, triton {versions.triton}")
            if self.opt.partial:
                # One bundle holds one set of versions: re-tuning part of it would have to drop
                # the rest, which a filtered run must not do.
                raise SweepInputError(f"{tuned_with}. A bundle holds one set of versions: re-tune the whole spec "
                                      "(no --kernel/--origin) with --force, or use another -o")
            if not self.opt.force:
                raise SweepInputError(f"{tuned_with}. Pass --force to re-tune every combo of the spec "
                                      "(entries outside it are dropped)")
        return bundle

    # --- workers ----------------------------------------------------------------------

    def _timeout(self) -> float:
        if self.opt.timeout_s is not None:
            return self.opt.timeout_s
        from autotune_cli.plan import EFFORT_SECONDS

        search = float(self.budget.seconds_per_combo or EFFORT_SECONDS[self.budget.effort])
        return 2 * search + 600

    def _start(self, combo: Combo, index: int, slot: int | None, tmp: Path, log_dir: Path,
               warm_start: list[dict[str, Any]] | None = None, isolated: bool = False) -> _Running:
        tag = "-isolated" if isolated else ""
        workdir = _new_dir(tmp / f"combo-{index:04d}{tag}")
        job = {"kernel": combo.kernel, "dims": combo.dims, "dtype": combo.dtype, "warm_start": warm_start,
               "budget": self.budget.model_dump(), "tolerance": self.tolerances[combo.dtype].model_dump(),
               "spawned_at": time.time()}  # the worker's "start" phase counts from here
        (workdir / "job.json").write_text(json.dumps(job))
        # The run's stamp first: the next run's logs (numbered from 0001 again) keep these.
        log_path = log_dir / f"{self._run_stamp}-{index:04d}-{combo.kernel}{tag}.log"
        # A warm worker for the slot takes the combo (an isolated retry, or --fresh-workers, gets
        # a one-shot worker of its own); else a new one is started, to serve this slot after it.
        warm = not isolated and not self.opt.fresh_workers
        if not warm:  # the slot's warm worker gives its GPU memory to the one-shot one
            self._stop_idle(slot)
        idle = self._idle.pop(slot, None)
        if idle is not None and idle.proc.poll() is None:
            log_path.write_bytes(b"")
            self._hand_off(idle.inbox, workdir, log_path)
            now = time.monotonic()
            return _Running(combo, index, slot, idle.proc, workdir, log_path, now, now + self._timeout(),
                            isolated, idle.inbox)
        if idle is not None:  # it died while idle: reaped here, replaced below
            idle.proc.wait()
        child_env = dict(os.environ)
        root = str(Path(__file__).resolve().parent.parent)
        child_env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [child_env.get("PYTHONPATH")])])
        child_env["PYTHONUNBUFFERED"] = "1"
        if self.opt.cpu_dry_run:
            child_env["HELION_INTERPRET"] = "1"
        elif slot is not None:
            child_env["CUDA_VISIBLE_DEVICES"] = str(slot)
        if isolated:
            child_env[ISOLATED_ENV[0]] = ISOLATED_ENV[1]
        inbox = None
        if warm:
            inbox = _new_dir(tmp / f"worker-{index:04d}")
            self._hand_off(inbox, workdir, log_path)
            args = ["--serve", str(inbox)]
        else:
            args = [str(workdir / "job.json"), str(workdir / "result.json"), str(workdir / "status.json")]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune_cli.worker", *args],
                stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        now = time.monotonic()
        return _Running(combo, index, slot, proc, workdir, log_path, now, now + self._timeout(), isolated, inbox)

    @staticmethod
    def _hand_off(inbox: Path, workdir: Path, log_path: Path) -> None:
        """Give a serving worker its next combo: the hand-off file, renamed in whole."""
        paths = {"job": str(workdir / "job.json"), "result": str(workdir / "result.json"),
                 "status": str(workdir / "status.json"), "log": str(log_path)}
        tmp = inbox / f"{INBOX_JOB}.tmp"
        tmp.write_text(json.dumps(paths))
        os.replace(tmp, inbox / INBOX_JOB)

    def _stop_idle(self, *slots: int | None) -> None:
        """Kill the warm workers that wait for a combo: those of `slots`, or all (at the
        sweep's end, or when it stops)."""
        for slot in (slots or list(self._idle)):
            idle = self._idle.pop(slot, None)
            if idle is not None:
                _kill_group(idle.proc)

    @staticmethod
    def _kill(run: _Running, dump_stacks: bool = False) -> None:
        if dump_stacks and STACKS_SIGNAL is not None:
            # The worker writes every thread's stack to its log (faulthandler); the kill follows.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                run.proc.send_signal(STACKS_SIGNAL)
            time.sleep(1.0)
        _kill_group(run.proc)

    @staticmethod
    def _result(run: _Running) -> dict[str, Any] | None:
        try:
            return json.loads(run.result_path.read_text())
        except (OSError, ValueError):
            return None

    def _collect(self, run: _Running, timed_out: bool, result: dict[str, Any] | None
                 ) -> tuple[Entry | None, Failure | None, KernelProvenance | None]:
        """The bundle record for a finished worker; `result` is its result file (None: none)."""
        combo = run.combo
        note = f" (retried with {'='.join(ISOLATED_ENV)})" if run.isolated else ""

        def fail(reason: str) -> tuple[None, Failure, None]:
            return None, Failure(kernel=combo.kernel, dims=combo.dims, dtype=combo.dtype, reason=reason + note,
                                 at=env.now()), None

        if timed_out:
            return fail(f"worker timed out after {_fmt_s(self._timeout())}; its threads' stacks at that moment are "
                        f"at the end of the log (log: {run.log_path})")
        if result is None:
            tail = _tail(run.log_path)
            return fail(f"worker exited with code {run.proc.returncode} and no result (log: {run.log_path}){tail}")
        if "error" in result:
            return fail(f"{result['error']} (log: {run.log_path})")
        kernel = KernelProvenance.model_validate(result["kernel"])
        if result["entry"] is not None:
            return Entry.model_validate(result["entry"]), None, kernel
        return None, Failure.model_validate(result["failure"]), kernel

    # --- the run ----------------------------------------------------------------------

    def run(self) -> SweepResult:
        gpu, versions, slots = self._environment()
        warm = self.warm_bundles(gpu.sku)  # bad input fails before anything is written
        path = bundle_path_for(self.opt.out_dir, gpu.sku, self.bundle_name)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(bundle_lock(path))
            except BundleBusy as e:
                raise SweepInputError(str(e)) from None
            with _stop_signals_raise():
                # What killed runs left: their temp folders, and (under the lock, so no
                # writer of this bundle is alive) half-written copies of the bundle.
                _remove_stale_temp_dirs(Path(tempfile.gettempdir()))
                _raise_if_stopped()
                for leftover in path.parent.glob(f"{glob_escape(temp_prefix(path))}*.tmp"):
                    leftover.unlink(missing_ok=True)
                return self._run_locked(path, gpu, versions, slots, warm)

    def _run_locked(self, path: Path, gpu: GpuInfo, versions: Versions, slots: list[int | None],
                    warm: list[Bundle]) -> SweepResult:
        bundle, stale = self._existing(path, gpu, versions)
        _raise_if_stopped()
        done = set() if bundle is None else set(bundle.entries)
        todo = [c for c in self.combos if self.opt.force or c.key not in done or c.key in stale]
        skipped = [c for c in self.combos if c not in todo]
        results = [ComboResult(c, bundle.entries[c.key] if bundle else None, None, 0.0, skipped=True) for c in skipped]
        con = self.console
        where = "CPU dry run (Helion ref mode, default configs, no search)" if self.opt.cpu_dry_run else \
            f"{gpu.name} x{len(slots)}"
        con.print(f"sweep {self.bundle_name}: {len(self.combos)} combos, {len(skipped)} already in {path}, "
                  f"{len(todo)} to tune on {where}", markup=False)
        if not todo:
            return SweepResult(path, results)

        log_dir = self.opt.log_dir / gpu.sku / self.bundle_name
        log_dir.mkdir(parents=True, exist_ok=True)
        writer = _BundleWriter(path, bundle, gpu, versions, self.spec_ref)
        queue = [(i, c, False) for i, c in enumerate(todo, start=1)]
        running: list[_Running] = []
        free: list[int | None] = list(slots)
        progress = _Progress(con, len(todo), len(slots), self.budget)

        # (A worker still writing into the folder may defeat its removal: the next start removes it.)
        with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-", ignore_cleanup_errors=True) as tmpdir, \
                con.status("") as status:
            tmp = Path(tmpdir)
            try:
                while queue or running:
                    self._fill_slots(queue, free, running, tmp, log_dir, [*filter(None, [writer.bundle]), *warm])
                    time.sleep(0.5)
                    _raise_if_stopped()
                    now = time.monotonic()
                    for run, timed_out, result in self._reap(running, free, now):
                        if self._retry_isolated(run, result, queue) or self._requeue_unclaimed(run, result, queue):
                            continue
                        entry, failure, kprov = self._collect(run, timed_out, result)
                        writer.save(entry, failure, kprov)
                        took = progress.combo_done(run, entry, failure, now, worker_phases(result, time.time(), run.inbox is not None))
                        results.append(ComboResult(run.combo, entry, failure, took))
                    progress.show(status, running, now)
                self._stop_idle()
            except BaseException as e:
                # Ctrl-C, SIGTERM/SIGHUP, or an error such as a full disk while writing the
                # bundle: no worker outlives the sweep, and the temp folder is removed after
                # they are gone.
                for run in running:
                    self._kill(run)
                self._stop_idle()
                if not isinstance(e, (KeyboardInterrupt, SweepTerminated)):
                    raise
                what = "interrupted"
                if isinstance(e, SweepTerminated):
                    what, e.reported = f"terminated by {e.name}", True
                con.print(f"[yellow]{what}: {progress.finished}/{progress.total} combos written to "
                          f"{escape(str(path))}; "
                          "rerun the same command to resume")
                raise
        return SweepResult(path, results)

    # --- scheduling and retry ---------------------------------------------------------

    def _fill_slots(self, queue: list[tuple[int, Combo, bool]], free: list[int | None], running: list[_Running],
                    tmp: Path, log_dir: Path, bundles: list[Bundle]) -> None:
        """Start queued combos (index, combo, isolated) while a GPU slot is free; each search
        starts from its key's config and the nearest tuned shapes' (`warm_start`) in `bundles`:
        the bundle as written so far, then the --warm-start ones."""
        kernels = all_kernels()
        while queue and free:
            i, combo, isolated = queue.pop(0)
            slot = free.pop(0)
            tk = kernels[combo.kernel]
            warm = warm_configs(tk.size_dims, combo.kernel, combo.dims, combo.dtype, bundles, across=tk.seed_across)
            running.append(self._start(combo, i, slot, tmp, log_dir, warm, isolated))

    def warm_bundles(self, sku: str) -> list[Bundle]:
        """The --warm-start bundles, each tuned on `sku`, this sweep's (SweepInputError if not)."""
        out = []
        for path in self.opt.warm_start:
            try:
                bundle = load_bundle(path)
            except BundleError as e:  # it names the file
                raise SweepInputError(f"--warm-start: {str(e).splitlines()[0]}") from None
            if bundle.provenance.gpu.sku != sku:
                raise SweepInputError(f"--warm-start {path}: tuned on {bundle.provenance.gpu.sku}, this sweep tunes "
                                      f"on {sku} (configs from another GPU are no starting point)")
            out.append(bundle)
        return out

    def _reap(self, running: list[_Running], free: list[int | None], now: float
              ) -> Iterator[tuple[_Running, bool, dict[str, Any] | None]]:
        """The combos that ended (their worker wrote its result or exited), or ran past their
        deadline (worker killed): (run, timed_out, its result file or None), slots freed. A warm
        worker that wrote an entry and is alive waits, idle, for its slot's next combo."""
        for run in list(running):
            alive = run.proc.poll() is None
            served = run.inbox is not None and run.result_path.exists()  # written whole (renamed in)
            timed_out = alive and not served and now > run.deadline
            if alive and not served and not timed_out:
                continue
            result = None if timed_out else self._result(run)
            if timed_out:
                self._kill(run, dump_stacks=True)
            elif served and alive and run.inbox is not None and (result or {}).get("entry") is not None:
                self._idle[run.slot] = _Idle(run.proc, run.inbox)
            elif served and alive:
                # No entry: the worker is on its way out (`worker.serve`); its result is written.
                self._kill(run)
            running.remove(run)
            free.append(run.slot)
            yield run, timed_out, result

    @staticmethod
    def _requeue_unclaimed(run: _Running, result: dict[str, Any] | None,
                           queue: list[tuple[int, Combo, bool]]) -> bool:
        """A warm worker that died between combos, before taking this one: queue it again,
        first, for a new worker (nothing of it ran)."""
        if result is not None or run.inbox is None or not (run.inbox / INBOX_JOB).exists():
            return False
        queue.insert(0, (run.index, run.combo, run.isolated))
        return True

    def _retry_isolated(self, run: _Running, result: dict[str, Any] | None,
                        queue: list[tuple[int, Combo, bool]]) -> bool:
        """Queue the combo again, first, in an isolated worker when `isolated_retry` says so."""
        if result is None or not isolated_retry(result, run.isolated, os.environ):
            return False
        first = (str(result.get("error", "")).splitlines() or [""])[0][:160]
        self.console.print(f"[yellow]{escape(run.combo.label())}: a config broke the worker's CUDA context "
                           f"({escape(first)}); retrying in a fresh "
                           f"worker with {'='.join(ISOLATED_ENV)} (log: {escape(str(run.log_path))})")
        queue.insert(0, (run.index, run.combo, True))
        return True


@contextlib.contextmanager
def _stop_signals_raise() -> Iterator[None]:
    """While the sweep runs, SIGTERM and SIGHUP raise SweepTerminated in the main thread,
    so they stop it as Ctrl-C does (workers killed, entries kept, temp folder removed);
    SIGINT raises KeyboardInterrupt by the same rule. A second signal during that clean-up
    is ignored; the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    handled = (signal.SIGINT, *STOP_SIGNALS)

    def stop(signum: int, frame: FrameType | None) -> None:
        for s in handled:
            signal.signal(s, signal.SIG_IGN)
        _STOPPED_BY.append(signum)
        # Raise only where the exception surely propagates: in the sweep's own loop (the
        # signal cut its sleep). Elsewhere (logging's at-fork lock release while a worker
        # starts, a library's cleanup) it may be printed as "Exception ignored" and lost,
        # or leave a half-started worker untracked: the loop raises it within half a second.
        if frame is not None and frame.f_code in _SAFE_TO_RAISE:
            _raise_if_stopped()

    _STOPPED_BY.clear()
    old = {s: signal.signal(s, stop) for s in handled}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        _STOPPED_BY.clear()


# The signal that stopped the sweep, once the handler ran; the sweep raises it at its next
# check (`_raise_if_stopped`) unless the handler could raise it at once.
_STOPPED_BY: list[int] = []
# The frames where the handler raises at once: the sweep's own sequential code.
_SAFE_TO_RAISE = frozenset({Sweep.run.__code__, Sweep._run_locked.__code__})


def _raise_if_stopped() -> None:
    if _STOPPED_BY:
        if _STOPPED_BY[0] == signal.SIGINT:
            raise KeyboardInterrupt
        raise SweepTerminated(_STOPPED_BY[0])


def _remove_stale_temp_dirs(tmp_root: Path) -> None:
    """Remove the temp folders of sweeps whose process is gone (killed with SIGKILL, or the
    machine went down): `mamba-tune-sweep-<pid>-*` of this user whose pid is not running.
    A live pid, even one reused by another program, keeps its folder."""
    for folder in tmp_root.glob(f"{TMP_PREFIX}*"):
        pid_text = folder.name[len(TMP_PREFIX):].partition("-")[0]
        try:
            if not pid_text.isdigit() or folder.is_symlink() or folder.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        pid = int(pid_text)
        if pid != os.getpid() and not _pid_alive(pid):
            shutil.rmtree(folder, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def _same_versions(a: Versions, b: Versions) -> bool:
    return (a.helion, a.torch, a.triton) == (b.helion, b.torch, b.triton)


def _stale_keys(bundle: Bundle) -> dict[str, set[str]]:
    """Kernel -> its entry keys, for each kernel whose source changed since the bundle tuned it."""
    kernels = all_kernels()
    stale: dict[str, set[str]] = {}
    for name, prov in bundle.provenance.kernels.items():
        tk = kernels.get(name)
        if tk is not None and prov.source_sha256 != tk.source_sha256():
            stale[name] = {k for k, e in bundle.entries.items() if e.kernel == name}
    return stale


def _rejected_configs(bundle: Bundle, keys: set[str]) -> dict[str, str]:
    """Key -> why, for the entries among `keys` whose config Helion rejects at their dims
    (an unknown key, a wrong length, an impossible value): such an entry is not done."""
    from autotune_cli.lowering import config_problem

    kernels = all_kernels()
    rejected: dict[str, str] = {}
    for key in sorted(keys & bundle.entries.keys()):
        entry = bundle.entries[key]
        tk = kernels.get(entry.kernel)
        why = None if tk is None else config_problem(tk, entry)
        if why is not None:
            rejected[key] = why
    return rejected


class _BundleWriter:
    """Persistence: each finished combo's entry or failure goes into the bundle at once,
    rewritten atomically, with the provenance brought up to date."""

    def __init__(self, path: Path, bundle: Bundle | None, gpu: GpuInfo, versions: Versions,
                 spec_ref: SpecRef | None) -> None:
        self.path = path
        self.bundle = bundle
        self.gpu = gpu
        self.versions = versions
        self.spec_ref = spec_ref
        self.created = bundle.provenance.created if bundle else env.now()
        self.kernels: dict[str, KernelProvenance] = dict(bundle.provenance.kernels) if bundle else {}

    def save(self, entry: Entry | None, failure: Failure | None, kprov: KernelProvenance | None) -> None:
        stamp = env.now()
        if kprov is not None:
            name = (entry or failure).kernel  # type: ignore[union-attr]
            old = self.kernels.get(name)
            if old is not None and old.source_sha256 != kprov.source_sha256 and self.bundle is not None:
                # The kernel's record moves to its new source: its entries tuned on the old one
                # (stale, queued for re-tuning) would pass for fresh under it, and a failed
                # re-tune would leave one to run (seen on the H200). They go; the failure or the
                # new entry takes the key.
                self.bundle = self.bundle.model_copy(
                    update={"entries": {k: e for k, e in self.bundle.entries.items() if e.kernel != name}})
            if old is None or old.source_sha256 != kprov.source_sha256:
                # Same source: the record stays as it is (one from before per-entry config-space
                # fingerprints keeps its fingerprint, which describes an entry still here).
                self.kernels[name] = kprov
        prov = Provenance(tool_version=env.tool_version(), git_sha=env.git_sha(), created=self.created,
                          updated=stamp, gpu=self.gpu, versions=self.versions, spec=self.spec_ref,
                          kernels=dict(self.kernels))
        cur = self.bundle or Bundle(provenance=prov)
        cur = cur.model_copy(update={"provenance": prov})
        cur = cur.with_entry(entry, updated=stamp) if entry is not None else cur.with_failure(failure, updated=stamp)  # type: ignore[arg-type]
        write_bundle(cur, self.path)
        self.bundle = cur


class _Progress:
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
        return _fmt_s(per * remaining / self.nslots)

    def combo_done(self, run: _Running, entry: Entry | None, failure: Failure | None, now: float,
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
            self.console.print(f"{head}: [green]ok[/] {escape(describe_entry(entry))} in {_fmt_s(took)}{spent}; "
                               f"elapsed {_fmt_s(now - self.t0)}, ETA {self.eta()}")
        else:
            self.console.print(f"{head}: [red]FAILED[/] {escape(failure.reason if failure else '?')}{spent}; "
                               f"elapsed {_fmt_s(now - self.t0)}, ETA {self.eta()}")
        return took

    def show(self, status: Status, running: list[_Running], now: float) -> None:
        """The status line: each running combo's phase, time and best so far."""
        parts = []
        for run in running:
            st = run.status()
            best = st.get("best_ms")
            parts.append(
                f"{run.combo.kernel} {st.get('phase', 'starting')} {_fmt_s(now - run.started)}"
                + (f" best {best:.4f} ms" if isinstance(best, (int, float)) else "")
                + (f" ({st['configs']} configs)" if st.get("configs") else ""))
        line = (f"[{self.finished}/{self.total}] elapsed {_fmt_s(now - self.t0)} ETA {self.eta()} | "
                + "; ".join(parts))
        status.update(Text(line))  # plain text: the status file is a worker's data
        if not self.console.is_terminal and now - self.last_note > 60:
            self.console.print(line, markup=False)
            self.last_note = now


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a worker and its children (its own session's process group), then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _new_dir(path: Path) -> Path:
    """Make `path`, or `path-2`, `path-3`, ... if taken (a combo queued again)."""
    n = 1
    while True:
        try:
            (candidate := path if n == 1 else path.with_name(f"{path.name}-{n}")).mkdir()
            return candidate
        except FileExistsError:
            n += 1


def worker_phases(result: dict[str, Any] | None, reaped_at: float, warm: bool) -> dict[str, float] | None:
    """Where a combo's time went, in order: the worker's start (spawn, or a warm worker's
    hand-off, to its imports done), the tune's phases, and from the result written to the sweep
    seeing it (wall clock; the sweep polls every 0.5 s): a one-shot worker's `exit`, a warm
    one's `wait`. None when the worker reported no phases (a crash or an error)."""
    if not result or not result.get("phases"):
        return None
    phases, written = result["phases"], result.get("written_at")
    tail = {"wait" if warm else "exit": max(0.0, reaped_at - written)} if isinstance(written, (int, float)) else {}
    return {**phases, **tail}


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return (": " + " | ".join(t.strip() for t in text[-lines:])) if text else ""

