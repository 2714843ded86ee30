"""Run a sweep: combos spread over GPUs, one worker process per GPU kept warm between combos
(or one per combo: --fresh-workers), every result written at once.

The bundle is rewritten atomically after each combo, so a crashed or killed sweep loses at
most the combos in flight; rerunning the same command skips what is already in the bundle
(unless --force). One sweep at a time may write a bundle: a file lock (`<bundle>.lock`)
is held for the whole run.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Iterator, Sequence
from glob import escape as glob_escape
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console
from rich.markup import escape

from autotune_cli import environment as env
from autotune_cli.bundle_lock import BundleBusy, bundle_lock
from autotune_cli.plan import Combo
from autotune_cli.sweep_job import (
    BundleWriter,
    ComboResult,
    SweepInputError,
    SweepJob,
    SweepResult,
    bundle_path_for,
    fmt_s,
)
from autotune_cli.sweep_progress import Progress, RunningCombo
from autotune_cli.worker import INBOX_JOB, STACKS_SIGNAL
from mamba_tune.bundle import (
    Bundle,
    Entry,
    Failure,
    GpuInfo,
    KernelProvenance,
    Versions,
    temp_prefix,
)
from mamba_tune.sku import GPU_SKUS


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
class _Idle:
    """A warm worker between combos (`worker.serve`), waiting on its inbox."""
    proc: subprocess.Popen[bytes]
    inbox: Path


class Sweep:
    """The local executor: runs a `SweepJob` on this machine's GPUs (or its CPU, dry run)."""

    def __init__(self, job: SweepJob, console: Console) -> None:
        self.job = job
        self.opt = job.options
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
        want = GPU_SKUS[self.job.target_sku]
        if (gpu.sku != want.sku or gpu.arch != want.arch) and not self.opt.allow_gpu_mismatch:
            raise SweepInputError(
                f"the spec targets {want.sku} ({want.arch}) but this GPU is {gpu.name} ({gpu.arch}); "
                "pass --allow-gpu-mismatch to tune for this GPU anyway"
            )
        return gpu, env.versions(), list(gpus)

    # --- workers ----------------------------------------------------------------------

    def _start(self, combo: Combo, index: int, slot: int | None, tmp: Path, log_dir: Path,
               job: dict[str, Any], isolated: bool = False) -> RunningCombo:
        tag = "-isolated" if isolated else ""
        workdir = _new_dir(tmp / f"combo-{index:04d}{tag}")
        # The worker's "start" phase counts from spawned_at.
        (workdir / "job.json").write_text(json.dumps({**job, "spawned_at": time.time()}))
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
            return RunningCombo(combo, index, slot, idle.proc, workdir, log_path, now, now + self.job.timeout_s(),
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
            # No preexec_fn: the worker ties its life to this process itself (worker.die_with).
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune_cli.worker", "--parent", str(os.getpid()), *args],
                stdout=log, stderr=subprocess.STDOUT, env=child_env, start_new_session=True,
            )
        now = time.monotonic()
        return RunningCombo(combo, index, slot, proc, workdir, log_path, now, now + self.job.timeout_s(), isolated, inbox)

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
    def _kill(run: RunningCombo, dump_stacks: bool = False) -> None:
        if dump_stacks and STACKS_SIGNAL is not None:
            # The worker writes every thread's stack to its log (faulthandler); the kill follows.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                run.proc.send_signal(STACKS_SIGNAL)
            time.sleep(1.0)
        _kill_group(run.proc)

    @staticmethod
    def _result(run: RunningCombo) -> dict[str, Any] | None:
        try:
            return json.loads(run.result_path.read_text())
        except (OSError, ValueError):
            return None

    def _collect(self, run: RunningCombo, timed_out: bool, result: dict[str, Any] | None
                 ) -> tuple[Entry | None, Failure | None, KernelProvenance | None]:
        """The bundle record for a finished worker; `result` is its result file (None: none)."""
        combo = run.combo
        note = f" (retried with {'='.join(ISOLATED_ENV)})" if run.isolated else ""

        def fail(reason: str) -> tuple[None, Failure, None]:
            return None, Failure(kernel=combo.kernel, dims=combo.dims, dtype=combo.dtype, reason=reason + note,
                                 at=env.now()), None

        if timed_out:
            return fail(f"worker timed out after {fmt_s(self.job.timeout_s())}; its threads' stacks at that moment are "
                        f"at the end of the log (log: {run.log_path})")
        if result is None:
            tail, death = _tail(run.log_path), run.death()
            # The log says how the worker died too (one killed by the OOM killer writes nothing).
            with contextlib.suppress(OSError), open(run.log_path, "a") as log:
                log.write(f"\nmamba-tune sweep: {death}\n")
            return fail(f"{death}; no result (log: {run.log_path}){tail}")
        if "error" in result:
            return fail(f"{result['error']} (log: {run.log_path})")
        kernel = KernelProvenance.model_validate(result["kernel"])
        if result["entry"] is not None:
            return Entry.model_validate(result["entry"]), None, kernel
        return None, Failure.model_validate(result["failure"]), kernel

    # --- the run ----------------------------------------------------------------------

    def run(self) -> SweepResult:
        gpu, versions, slots = self._environment()
        warm = self.job.warm_bundles(gpu.sku)  # bad input fails before anything is written
        path = bundle_path_for(self.opt.out_dir, gpu.sku, self.job.bundle_name)
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
        bundle, stale = self.job.existing(path, gpu, versions, self.console)
        _raise_if_stopped()
        todo, results = self.job.todo(bundle, stale)
        con = self.console
        where = "CPU dry run (Helion ref mode, default configs, no search)" if self.opt.cpu_dry_run else \
            f"{gpu.name} x{len(slots)}"
        con.print(f"sweep {self.job.bundle_name}: {len(self.job.combos)} combos, {len(results)} already in {path}, "
                  f"{len(todo)} to tune on {where}{self.job.adoption_note(todo, warm)}", markup=False)
        if not todo:
            return SweepResult(path, results)

        log_dir = self.opt.log_dir / gpu.sku / self.job.bundle_name
        log_dir.mkdir(parents=True, exist_ok=True)
        writer = BundleWriter(path, bundle, gpu, versions, self.job.spec_ref)
        queue = [(i, c, False) for i, c in enumerate(todo, start=1)]
        running: list[RunningCombo] = []
        free: list[int | None] = list(slots)
        progress = Progress(con, len(todo), len(slots), self.job.budget)

        # (A worker still writing into the folder may defeat its removal: the next start removes it.)
        with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-", ignore_cleanup_errors=True) as tmpdir, \
                con.status("") as status:
            tmp = Path(tmpdir)
            try:
                while queue or running:
                    self._fill_slots(queue, free, running, tmp, log_dir, [*filter(None, [writer.bundle]), *warm], warm)
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

    def _fill_slots(self, queue: list[tuple[int, Combo, bool]], free: list[int | None], running: list[RunningCombo],
                    tmp: Path, log_dir: Path, bundles: list[Bundle], siblings: Sequence[Bundle] = ()) -> None:
        """Start queued combos (index, combo, isolated) while a GPU slot is free; each search
        starts from its key's config and the nearest tuned shapes' (`warm_start`) in `bundles`:
        the bundle as written so far, then the --warm-start ones (`siblings`: those, for
        --adopt-sibling)."""
        while queue and free:
            i, combo, isolated = queue.pop(0)
            slot = free.pop(0)
            job = self.job.worker_job(combo, bundles, siblings)
            running.append(self._start(combo, i, slot, tmp, log_dir, job, isolated))

    def _reap(self, running: list[RunningCombo], free: list[int | None], now: float
              ) -> Iterator[tuple[RunningCombo, bool, dict[str, Any] | None]]:
        """The combos that ended (their worker wrote its result or exited), or ran past their
        deadline (worker killed): (run, timed_out, its result file or None), slots freed. A warm
        worker that wrote an entry and is alive waits, idle, for its slot's next combo."""
        for run in list(running):
            alive = not run.exited()
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
    def _requeue_unclaimed(run: RunningCombo, result: dict[str, Any] | None,
                           queue: list[tuple[int, Combo, bool]]) -> bool:
        """A warm worker that died between combos, before taking this one: queue it again,
        first, for a new worker (nothing of it ran)."""
        if result is not None or run.inbox is None or not (run.inbox / INBOX_JOB).exists():
            return False
        queue.insert(0, (run.index, run.combo, run.isolated))
        return True

    def _retry_isolated(self, run: RunningCombo, result: dict[str, Any] | None,
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

