"""The sweep end to end with real worker processes (CPU dry run: Helion ref mode, no
search): every entry written at once, resume after a SIGKILL, the file lock, failures."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock
from rich.console import Console

from mamba_tune.bundle import load_bundle

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests/data/tiny.yaml"

pytestmark = pytest.mark.slow


def sweep_cmd(out: Path, *extra: str, spec: Path = SPEC) -> list[str]:
    return [sys.executable, "-m", "autotune_cli", "sweep", str(spec), "-o", str(out), "--cpu-dry-run",
            "--log-dir", str(out / "logs"), *extra]


def env(tmpdir: Path | None = None) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [e.get("PYTHONPATH")])])
    if tmpdir is not None:  # the sweep's temp folders go there
        tmpdir.mkdir(exist_ok=True)
        e["TMPDIR"] = str(tmpdir)
    return e


def sweep_dirs(tmpdir: Path) -> list[str]:
    return sorted(p.name for p in tmpdir.glob("mamba-tune-sweep-*"))


def processes_using(path: Path) -> list[int]:
    """Pids of the processes whose command line names something under `path` (the workers)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def wait_for_entry(proc: subprocess.Popen[bytes], bundle_path: Path) -> None:
    deadline = time.time() + 400
    while time.time() < deadline:
        if bundle_path.exists() and load_bundle(bundle_path).entries:
            return
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
        time.sleep(0.2)
    pytest.fail("no entry written in time")


def small_spec(tmp_path: Path) -> Path:
    """The tiny spec at TP 1 only: 4 combos, to keep the subprocess tests short."""
    p = tmp_path / "tiny.yaml"
    p.write_text(SPEC.read_text().replace("tp: [1, 2]", "tp: [1]"))
    return p


def combo_starts(stderr: str, after: str) -> list[float]:
    """Each finished combo's start phase, in order, from a sweep's lines (`after`: the phase
    that follows the tune's: wait for a warm worker, exit for a one-shot one)."""
    flat = " ".join(stderr.split())
    return [float(s) for s in re.findall(
        r"\(start ([\d.]+)s, setup [\d.]+s, search [\d.]+s, check [\d.]+s, timing [\d.]+s, "
        rf"baseline [\d.]+s, {after} [\d.]+s, rest [\d.]+s\)", flat)]


def test_fresh_workers_start_a_process_per_combo(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(sweep_cmd(out, "--fresh-workers", "--origin", "tp=2 batch=1 seqlen=40"), env=env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    spent = combo_starts(r.stderr, "exit")
    # Each of the two combos' workers imported torch and helion itself.
    assert len(spent) == 2 and all(s > 0.5 for s in spent), r.stderr[-3000:]
    assert len(load_bundle(out / "cpu" / "tiny.json").entries) == 2


def test_resume_after_kill(tmp_path):
    out = tmp_path / "out"
    spec = small_spec(tmp_path)
    bundle_path = out / "cpu" / "tiny.json"
    tmpdir = tmp_path / "tmp"
    proc = subprocess.Popen(sweep_cmd(out, spec=spec), env=env(tmpdir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    wait_for_entry(proc, bundle_path)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = load_bundle(bundle_path)  # still valid JSON: writes are atomic
    done = len(first.entries)
    assert 1 <= done < 4
    # What a kill leaves: the temp folder (its name holds the dead sweep's pid), and a
    # half-written bundle copy when the kill lands during a write (planted here: that race
    # is too narrow to hit on purpose). A folder of a live process stays.
    assert sweep_dirs(tmpdir) and all(d.startswith(f"mamba-tune-sweep-{proc.pid}-") for d in sweep_dirs(tmpdir))
    (bundle_path.parent / ".tiny.json.k1ll3d.tmp").write_text('{"half": ')
    live = tmpdir / f"mamba-tune-sweep-{os.getpid()}-live"
    live.mkdir()

    r = subprocess.run(sweep_cmd(out, spec=spec), env=env(tmpdir), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"4 combos, {done} already in" in r.stderr
    # Each combo's line says where its time went: the worker's start (its imports), the tune's
    # phases, the wait for the sweep to see the result, then the rest; its log has the start
    # and the phases too. One worker, kept warm, tuned them all: only the first paid the imports.
    spent = combo_starts(r.stderr, "wait")
    assert len(spent) == 4 - done, r.stderr[-3000:]
    assert spent[0] > 0.5 and all(s < spent[0] / 2 for s in spent[1:]), spent
    logs = sorted((out / "logs").rglob("*.log"))
    assert sum("phases: start " in p.read_text() for p in logs) >= 4 - done, [p.name for p in logs]
    assert sweep_dirs(tmpdir) == [live.name]
    assert sorted(p.name for p in bundle_path.parent.iterdir()) == ["tiny.json", "tiny.json.lock"]
    final = load_bundle(bundle_path)
    assert len(final.entries) == 4 and not final.failures
    for key, e in first.entries.items():  # kept as written, not redone
        assert final.entries[key].tuned_at == e.tuned_at
    assert final.provenance.gpu.sku == "cpu" and final.provenance.spec and final.provenance.spec.name == "tiny"
    assert set(final.provenance.kernels) == {"gated_norm_fwd", "gated_norm_bwd"}
    for e in final.entries.values():
        assert e.accuracy.passed and e.search.effort == "none"

    # a third run has nothing to do
    r = subprocess.run(sweep_cmd(out, spec=spec), env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "4 already in" in r.stderr and "0 to tune" in r.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_sigterm_and_sighup_stop_the_sweep_like_ctrl_c(tmp_path, sig):
    out = tmp_path / "out"
    spec = small_spec(tmp_path)
    bundle_path = out / "cpu" / "tiny.json"
    tmpdir = tmp_path / "tmp"
    proc = subprocess.Popen(sweep_cmd(out, spec=spec), env=env(tmpdir), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    wait_for_entry(proc, bundle_path)
    assert sweep_dirs(tmpdir)
    proc.send_signal(sig)  # to the sweep alone, as `kill PID` or a closing terminal would
    _, stderr = proc.communicate(timeout=120)
    text = stderr.decode()
    assert proc.returncode == 128 + sig, text[-2000:]
    last = text.strip().splitlines()[-1]
    what = "interrupted" if sig == signal.SIGINT else f"terminated by {sig.name}"
    assert f"{what}: " in last and f"combos written to {bundle_path}" in last, text[-2000:]
    assert "Traceback" not in text
    kept = load_bundle(bundle_path)  # finished entries stay
    assert 1 <= len(kept.entries) <= 4
    assert sweep_dirs(tmpdir) == []  # temp folder removed
    assert processes_using(tmpdir) == []  # no worker left running
    assert sorted(p.name for p in bundle_path.parent.iterdir()) == ["tiny.json", "tiny.json.lock"]


def test_lock_held_by_another_process(tmp_path):
    out = tmp_path / "out"
    (out / "cpu").mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from filelock import FileLock; "
         f"l = FileLock({str(out / 'cpu' / 'tiny.json.lock')!r}); l.acquire(); print('held', flush=True); "
         "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = subprocess.run(sweep_cmd(out), env=env(), capture_output=True, text=True, timeout=300)
        assert r.returncode == 2
        assert "another sweep is writing" in r.stderr
        assert not (out / "cpu" / "tiny.json").exists()
    finally:
        holder.kill()
        holder.wait()
    with FileLock(str(out / "cpu" / "tiny.json.lock")).acquire(timeout=5):
        pass


def test_worker_failure_is_recorded_and_exits_1(tmp_path):
    """A combo whose worker hangs past the timeout is a recorded failure, with its stacks in the log."""
    out = tmp_path / "out"
    r = subprocess.run(sweep_cmd(out, "--timeout", "2", spec=small_spec(tmp_path)), env=env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    b = json.loads((out / "cpu" / "tiny.json").read_text())
    assert len(b["failures"]) == 4 and not b["entries"]
    assert all("timed out" in f["reason"] for f in b["failures"].values())
    assert "4 combo(s) failed" in r.stderr
    # Before the kill, each worker wrote its threads' stacks to its log (worker.STACKS_SIGNAL).
    logs = sorted((out / "logs" / "cpu" / "tiny").glob("*.log"))
    assert len(logs) == 4
    for log in logs:
        assert "most recent call first" in log.read_text(), log
    # The next run (failures are tried again) numbers its combos from 1 too: the logs above stay.
    r = subprocess.run(sweep_cmd(out, "--timeout", "2", spec=small_spec(tmp_path)), env=env(),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    again = sorted((out / "logs" / "cpu" / "tiny").glob("*.log"))
    assert len(again) == 8 and set(logs) < set(again), [p.name for p in again]
    assert all(str(p) in json.dumps(json.loads((out / "cpu" / "tiny.json").read_text())["failures"])
               for p in set(again) - set(logs))


def test_origin_filter_tunes_only_that_shape(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(sweep_cmd(out, "--origin", "tp=2 batch=1 seqlen=40"), env=env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    entries = load_bundle(out / "cpu" / "tiny.json").entries
    # TP 2 of the tiny model: 2 heads x 16 = d 32, one group; batch 1 x seqlen 40 = 40 rows.
    assert sorted(e.kernel for e in entries.values()) == ["gated_norm_bwd", "gated_norm_fwd"]
    assert {(e.dims["rows"], e.dims["d"]) for e in entries.values()} == {(40, 32)}


def test_other_versions_refuse_a_filtered_run_and_keep_the_bundle(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(sweep_cmd(out, "--origin", "tp=2 batch=1 seqlen=40"), env=env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    path = out / "cpu" / "tiny.json"
    data = json.loads(path.read_text())
    data["provenance"]["versions"]["helion"] = "0.0.1"  # as if tuned with another helion
    path.write_text(json.dumps(data))
    before = path.read_bytes()

    # A filtered --force run would have to drop the other entries: refused, nothing written.
    r = subprocess.run(sweep_cmd(out, "--kernel", "gated_norm_fwd", "--force"), env=env(), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "helion 0.0.1" in r.stderr and "no --kernel/--origin" in r.stderr
    assert path.read_bytes() == before
    # Without filters and without --force: refused too, and it says how to go on.
    r = subprocess.run(sweep_cmd(out), env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 2 and "Pass --force" in r.stderr, r.stderr[-3000:]
    assert path.read_bytes() == before


def test_resume_re_tunes_entries_whose_config_helion_rejects(tmp_path):
    """An entry with a config Helion rejects is not done: resuming puts it back in the queue
    (the resume decision of a GPU sweep; its config check runs on the CPU)."""
    from bundles import H200, VERSIONS, bundle, entry

    from autotune_cli.plan import plan
    from autotune_cli.spec import load_spec
    from autotune_cli.sweep_job import SweepJob, SweepOptions
    from mamba_tune.bundle import write_bundle

    spec = load_spec(small_spec(tmp_path))
    combos = [c for c in plan(spec) if c.kernel == "gated_norm_fwd"][:2]
    good, bad = (entry(c.kernel, c.dims, c.dtype) for c in combos)
    bad = bad.model_copy(update={"config": {**bad.config, "block_sizes": [8, 1, 1]}})
    path = tmp_path / "h200" / "tiny.json"
    write_bundle(bundle(good, bad), path)
    out = io.StringIO()
    job = SweepJob(combos, budget=spec.budget, tolerances=spec.tolerances, target_sku="h200", bundle_name="tiny",
                   spec_ref=None, options=SweepOptions(out_dir=tmp_path))
    resumed, stale = job.existing(path, H200, VERSIONS, Console(file=out, width=400))
    assert resumed is not None and set(resumed.entries) == {good.key, bad.key}
    assert stale == {bad.key}
    assert f"{bad.key}: Helion rejects its config (InvalidConfig: Too many values for config['block_sizes']" \
        in out.getvalue()


def test_a_failed_re_tune_after_a_kernel_change_leaves_no_stale_entry_for_fresh(tmp_path):
    """A kernel whose source changed: its entries are stale and queued. When the first result
    for it comes (here a failure) the bundle's record of the kernel moves to the new source,
    so its old entries go: kept, they would pass for fresh and run (seen on the H200, where a
    re-tune failed and the stale entry stayed under the new source's record)."""
    from bundles import H200, VERSIONS, bundle, entry

    from autotune_cli.plan import plan
    from autotune_cli.spec import load_spec
    from autotune_cli.sweep_job import BundleWriter
    from mamba_tune.bundle import Failure, KernelProvenance, load_bundle

    spec = load_spec(small_spec(tmp_path))
    combos = [c for c in plan(spec) if c.kernel == "gated_norm_fwd"][:2]
    first, second = (entry(c.kernel, c.dims, c.dtype) for c in combos)
    old = bundle(first, second, kernel_hashes={"gated_norm_fwd": "0" * 64})
    path = tmp_path / "h200" / "tiny.json"
    writer = BundleWriter(path, old, H200, VERSIONS, None)
    new = KernelProvenance(source_sha256="1" * 64)
    writer.save(None, Failure(kernel=first.kernel, dims=first.dims, dtype=first.dtype, reason="autotune failed",
                              at="2026-12-02T00:00:00+00:00"), new)
    saved = load_bundle(path)
    assert saved.provenance.kernels["gated_norm_fwd"].source_sha256 == "1" * 64
    assert saved.entries == {} and set(saved.failures) == {first.key}
    # Later results under the same source keep each other.
    writer.save(second.model_copy(update={"tuned_at": "2026-12-02T00:00:01+00:00"}), None, new)
    writer.save(first, None, new)
    assert set(load_bundle(path).entries) == {first.key, second.key}


def test_a_combo_no_warm_worker_took_is_queued_again(tmp_path):
    # A warm worker that dies after the hand-off file was renamed into its inbox and before it
    # took it: the combo ran nowhere, so it goes back to the front of the queue for a new
    # worker; once taken (the file gone) or with a result, it is the worker's to account for.
    from autotune_cli.sweep import Sweep
    from autotune_cli.sweep_progress import RunningCombo
    from autotune_cli.worker import INBOX_JOB

    inbox = tmp_path / "worker-0001"
    inbox.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    run = RunningCombo("combo", 7, None, proc, tmp_path / "combo-0007", tmp_path / "0007.log", 0.0, 1.0,  # type: ignore[arg-type]
                   inbox=inbox)
    queue: list = [(8, "next", False)]
    assert not Sweep._requeue_unclaimed(run, None, queue)  # taken: no hand-off file left
    (inbox / INBOX_JOB).write_text("{}")
    assert not Sweep._requeue_unclaimed(run, {"error": "x"}, queue)  # it wrote a result
    assert Sweep._requeue_unclaimed(run, None, queue)
    assert queue == [(7, "combo", False), (8, "next", False)]
    one_shot = RunningCombo("combo", 9, None, proc, tmp_path / "c9", tmp_path / "9.log", 0.0, 1.0)  # type: ignore[arg-type]
    assert not Sweep._requeue_unclaimed(one_shot, None, queue)


def test_each_entry_records_the_config_space_it_was_tuned_in(tmp_path):
    """The dx backward's packed and unpacked calls bind different Helion config spaces (other
    loads): each entry records its own fingerprint, the one `validate` binds its dims to; the
    kernel's provenance record carries none (one per kernel was overwritten by the packed
    entry's at Zamba2)."""
    from autotune_cli.lowering import config_spec
    from autotune_cli.tuning import get

    spec = tmp_path / "packed.yaml"
    spec.write_text(SPEC.read_text().replace("tp: [1, 2]", "tp: [1]").replace("seqlen: [64, 40]", "seqlen: [64]")
                    .replace("kernels: [gated_norm_fwd, gated_norm_bwd]",
                             "kernels: [ssd_chunk_scan_chunk_state_bwd_dx]\npacked_sequences: [false, true]"))
    out = tmp_path / "out"
    r = subprocess.run(sweep_cmd(out, spec=spec), env=env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    b = load_bundle(out / "cpu" / "tiny.json")
    tk = get("ssd_chunk_scan_chunk_state_bwd_dx")
    fps = {e.dims["has_seq_idx"]: e.search.config_spec_fingerprint for e in b.entries.values()}
    assert set(fps) == {0, 1}, list(b.entries)
    for e in b.entries.values():
        assert e.search.config_spec_fingerprint == config_spec(tk, e.dims, e.dtype).structural_fingerprint_hash()
    assert fps[0] != fps[1]
    assert b.provenance.kernels[tk.name].config_spec_fingerprint is None


def test_a_kernel_record_from_before_per_entry_fingerprints_is_kept_while_its_source_is(tmp_path):
    """A new entry of a kernel whose source is unchanged leaves the kernel's record as it was:
    its old fingerprint still describes an entry of the bundle. A new source replaces it."""
    from bundles import H200, VERSIONS, bundle, entry

    from autotune_cli.plan import plan
    from autotune_cli.spec import load_spec
    from autotune_cli.sweep_job import BundleWriter
    from mamba_tune.bundle import KernelProvenance

    spec = load_spec(small_spec(tmp_path))
    first, second = (entry(c.kernel, c.dims, c.dtype) for c in
                     [c for c in plan(spec) if c.kernel == "gated_norm_fwd"][:2])
    old = bundle(first, kernel_hashes={"gated_norm_fwd": "0" * 64})
    legacy = KernelProvenance(source_sha256="0" * 64, config_spec_fingerprint="f" * 64)
    old = old.model_copy(update={"provenance": old.provenance.model_copy(
        update={"kernels": {"gated_norm_fwd": legacy}})})
    path = tmp_path / "h200" / "tiny.json"
    writer = BundleWriter(path, old, H200, VERSIONS, None)
    writer.save(second, None, KernelProvenance(source_sha256="0" * 64))
    saved = load_bundle(path)
    assert saved.provenance.kernels["gated_norm_fwd"] == legacy
    assert set(saved.entries) == {first.key, second.key}
    writer.save(first, None, KernelProvenance(source_sha256="1" * 64))
    assert load_bundle(path).provenance.kernels["gated_norm_fwd"] == KernelProvenance(source_sha256="1" * 64)


def test_a_worker_killed_by_a_signal_leaves_a_log_saying_how(tmp_path):
    """A real worker SIGKILLed (what the OOM killer sends) before it wrote anything: the
    failure and the worker's log name the signal, the phase it was in and its peak memory.
    (A one-shot worker: a warm one killed before it took its combo has the combo queued again.)"""
    out, tmpdir = tmp_path / "out", tmp_path / "tmp"
    proc = subprocess.Popen(sweep_cmd(out, "--kernel", "gated_norm_fwd", "--origin", "tp=2 batch=1 seqlen=40",
                                      "--fresh-workers"),
                            env=env(tmpdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.time() + 300
        while not (workers := processes_using(tmpdir)):  # its command line names its inbox in TMPDIR
            assert time.time() < deadline and proc.poll() is None, "no worker started"
            time.sleep(0.05)
        os.kill(workers[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, stderr.decode()[-3000:]
    (failure,) = load_bundle(out / "cpu" / "tiny.json").failures.values()
    m = re.match(r"the worker \(pid (\d+)\) was killed by signal 9 \(SIGKILL: out of memory\?\) in phase '(.+)' "
                 r"after \d+m\d\ds, peak RSS (\d+) MB; no result \(log: (.+?\.log)\)", failure.reason)
    assert m, failure.reason
    assert int(m[1]) == workers[0] and m[2].startswith("start") and int(m[3]) > 0
    log = Path(m[4]).read_text()
    assert log.rstrip().endswith(f"mamba-tune sweep: {failure.reason.split('; no result')[0]}"), log[-2000:]


def test_a_worker_whose_sweep_is_gone_runs_nothing(tmp_path):
    """`--parent PID` names the sweep: a worker started after it died (its parent is another
    process) says so and exits without a result; a bad --parent is a usage line and exit 2."""
    job, result = tmp_path / "job.json", tmp_path / "result.json"
    job.write_text("{}")
    r = subprocess.run([sys.executable, "-m", "autotune_cli.worker", "--parent", "1", str(job), str(result)],
                       capture_output=True, text=True, timeout=120, env=env())
    assert r.returncode == 0 and r.stderr.strip() == "worker: its sweep (pid 1) is gone; nothing run", r.stderr
    assert not result.exists()
    r = subprocess.run([sys.executable, "-m", "autotune_cli.worker", "--parent", "x", str(job), str(result)],
                       capture_output=True, text=True, timeout=120, env=env())
    assert r.returncode == 2 and r.stderr.startswith("usage: python -m autotune_cli.worker [--parent PID]")


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_die_with_ties_a_busy_worker_to_its_sweep(tmp_path):
    """`worker.die_with`: a process that called it dies when its parent is SIGKILLed, busy or not
    (the serving loop's own parent check only runs between combos)."""
    child = ("import sys, time; from autotune_cli.worker import die_with; "
             "assert die_with(int(sys.argv[1])); print('tied', flush=True); time.sleep(120)")
    parent = ("import os, subprocess, sys; "
              f"c = subprocess.Popen([sys.executable, '-c', {child!r}, str(os.getpid())], stdout=subprocess.PIPE); "
              "print(c.pid, c.stdout.readline().decode().strip(), flush=True); import time; time.sleep(120)")
    p = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, env=env(), start_new_session=True)
    try:
        pid, word = p.stdout.readline().decode().split()  # type: ignore[union-attr]
        assert word == "tied"
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.time() + 30
        while time.time() < deadline and _alive(int(pid)):
            time.sleep(0.1)
        assert not _alive(int(pid))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie nobody reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status
