"""`sweep --executor slurm` against a real one-node Slurm started on this machine (no mock):
a CPU dry-run sweep as a real job array, scancel half way then resume, a task killed and
retried, two specs into one folder, status and collect. The daemons are started by the
session fixture; where they cannot start the tests skip with the reason (CI sets
MAMBA_TUNE_REQUIRE_SLURM=1, which turns that skip into a failure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import LocalSlurm, SlurmUnavailable

from mamba_tune.bundle import load_bundle

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests/data/tiny.yaml"

# One pytest-xdist worker runs them all (`--dist loadgroup`): one cluster, started once.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm")]


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except SlurmUnavailable as e:
        cluster.stop()
        reason = f"no local Slurm: {e}"
        print(reason, file=sys.stderr)
        if os.environ.get("MAMBA_TUNE_REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    yield cluster
    cluster.stop()


def env(cluster: LocalSlurm) -> dict[str, str]:
    e = cluster.env
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [e.get("PYTHONPATH")])])
    return e


def spec(tmp_path: Path, name: str = "tiny") -> Path:
    """The tiny spec at TP 1: with --kernel gated_norm_fwd, two combos (seqlen 64 and 40)."""
    p = tmp_path / f"{name}.yaml"
    p.write_text(SPEC.read_text().replace("tp: [1, 2]", "tp: [1]").replace("name: tiny\n", f"name: {name}\n"))
    return p


def sweep_cmd(spec_path: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autotune_cli", "sweep", str(spec_path), "-o", str(out), "--cpu-dry-run",
            "--kernel", "gated_norm_fwd", "--executor", "slurm", *extra]


def cli(cluster: LocalSlurm, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune_cli", *args], env=env(cluster), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def queue(cluster: LocalSlurm) -> dict[str, str]:
    r = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T"], env=cluster.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return dict(line.split("|") for line in r.stdout.split())


def wait_for(what: str, cond, timeout: float = 500, proc: subprocess.Popen[str] | None = None) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"sweep exited ({proc.returncode}) before {what}: {proc.stderr.read() if proc.stderr else ''}")
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


def entries(path: Path) -> dict:
    return load_bundle(path).entries if path.exists() else {}


def state(out: Path, name: str = "tiny") -> dict:
    return json.loads((out / "cpu" / f"{name}.slurm" / "state.json").read_text())


def test_cancel_half_way_then_resume(slurm, tmp_path):
    out, sp = tmp_path / "out", spec(tmp_path)
    bundle = out / "cpu" / "tiny.json"
    r = cli(slurm, *sweep_cmd(sp, out, "--no-wait", "--max-parallel", "1")[3:])
    assert r.returncode == 0, r.stderr
    array_id = r.stdout.strip().splitlines()[-1]
    assert array_id.isdigit() and "submitted job array" in r.stderr
    assert len([j for j in queue(slurm) if j.startswith(f"{array_id}_")]) == 2
    # The array's size and concurrency, and the time limit from the budget: 2 x 30 s (the spec's
    # seconds_per_combo) + 600 s of set-up = 11 min.
    script = (out / "cpu" / "tiny.slurm" / "logs" / f"{array_id}_submission.sh").read_text()
    assert "#SBATCH --array=0-1%1" in script and "#SBATCH --time=11" in script, script
    # The pickled tasks (submitit's folder) under a folder only their owner can enter.
    assert (out / "cpu" / "tiny.slurm").stat().st_mode & 0o777 == 0o700
    assert (out / "cpu" / "tiny.slurm" / "logs").stat().st_mode & 0o777 == 0o700
    wait_for("the first entry", lambda: len(entries(bundle)) >= 1)
    subprocess.run(["scancel", array_id], env=slurm.env, check=True)
    wait_for("the array to leave the queue", lambda: not any(j.startswith(f"{array_id}_") for j in queue(slurm)), 60)
    first = load_bundle(bundle)  # never torn
    assert len(first.entries) == 1, "the second task should not have finished within a second"
    (done_key, done_entry), = first.entries.items()

    st = cli(slurm, "status", str(out))
    assert st.returncode == 0, st.stderr
    assert "1 cancelled" in st.stdout and "1 done" in st.stdout, st.stdout

    r = cli(slurm, *sweep_cmd(sp, out)[3:])
    assert r.returncode == 0, r.stderr
    assert "1 already in" in r.stderr and "1 to submit" in r.stderr
    final = load_bundle(bundle)
    assert len(final.entries) == 2 and not final.failures
    assert final.entries[done_key].tuned_at == done_entry.tuned_at  # not tuned twice
    attempts = {k: len(v["attempts"]) for k, v in state(out)["combos"].items()}
    assert attempts[done_key] == 1 and sorted(attempts.values()) == [1, 2]

    # Re-running the same sweep submits nothing.
    r = cli(slurm, *sweep_cmd(sp, out, "--no-wait")[3:])
    assert r.returncode == 0 and "0 to submit" in r.stderr, r.stderr


def test_killed_task_is_recorded_and_retried(slurm, tmp_path):
    out, sp = tmp_path / "out", spec(tmp_path)
    proc = subprocess.Popen(sweep_cmd(sp, out, "--max-parallel", "1"), env=env(slurm), cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        state_file = out / "cpu" / "tiny.slurm" / "state.json"
        wait_for("the submission", state_file.exists, proc=proc)
        first_job = {a["attempts"][0]["job_id"] for a in state(out)["combos"].values()}
        running: list[str] = []

        def one_running() -> bool:
            running[:] = [j for j, s in queue(slurm).items() if j in first_job and s == "RUNNING"]
            return bool(running)

        wait_for("a running task", one_running, proc=proc)
        # The whole task, batch script and steps (`--signal` alone reaches only job steps, and the
        # task's step may not have started yet: then nothing would die).
        subprocess.run(["scancel", running[0]], env=slurm.env, check=True)
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "retrying once" in stderr and running[0] in stderr
    bundle = load_bundle(out / "cpu" / "tiny.json")
    assert len(bundle.entries) == 2 and not bundle.failures
    killed = next(v for v in state(out)["combos"].values() if v["attempts"][0]["job_id"] == running[0])
    assert [a["state"] for a in killed["attempts"]] == ["DIED", "DONE"]
    assert killed["attempts"][0]["reason"].startswith("CANCELLED") and killed["attempts"][1]["retry"]


def test_two_specs_into_one_folder_status_and_collect(slurm, tmp_path):
    out = tmp_path / "out"
    a, b = spec(tmp_path, "tiny"), spec(tmp_path, "tiny2")
    procs = [subprocess.Popen(sweep_cmd(s, out, "--origin", "seqlen=64"), env=env(slurm), cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for s in (a, b)]
    for p in procs:
        _, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr
    for name in ("tiny", "tiny2"):
        bundle = load_bundle(out / "cpu" / f"{name}.json")
        assert len(bundle.entries) == 1 and bundle.provenance.spec.name == name
        assert list((out / "cpu" / f"{name}.slurm" / "logs").glob("*_log.out"))
    st = cli(slurm, "status", str(out))
    assert st.returncode == 0, st.stderr
    assert st.stdout.count("1 done") == 2, st.stdout

    # A task killed between writing its result and merging it: collect merges the result.
    combo_dir, = (out / "cpu" / "tiny2.slurm" / "combos").iterdir()
    (combo_dir / "merged.json").unlink()
    (out / "cpu" / "tiny2.json").unlink()
    st = cli(slurm, "status", str(out / "cpu" / "tiny2.json"))
    assert "not merged" in st.stdout, st.stdout
    r = cli(slurm, "collect", str(out))
    assert r.returncode == 0, r.stderr
    assert "merged 1 result" in r.stdout and "entry" in r.stdout
    assert len(load_bundle(out / "cpu" / "tiny2.json").entries) == 1


def test_bad_slurm_options_are_one_line(tmp_path):
    """No cluster needed: the options are checked before anything is submitted."""
    sp = spec(tmp_path)
    e = {**os.environ, "PYTHONPATH": str(ROOT)}
    for extra, word in ((["--slurm-extra", "qos"], "KEY=VALUE"), (["--gpus", "0"], "--slurm-gpus-per-task")):
        r = subprocess.run(sweep_cmd(sp, tmp_path / "out", *extra), env=e, cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 2, r.stderr  # the dry-run note + error
        assert word in r.stderr.splitlines()[-1]
        assert not (tmp_path / "out").exists()
    # A --warm-start bundle that cannot be read: refused before the state folder is made.
    bad = tmp_path / "h200.json"
    bad.write_text("{", encoding="utf-8")
    r = subprocess.run(sweep_cmd(sp, tmp_path / "out", "--warm-start", str(bad)), env=e, cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and str(bad) in r.stderr.splitlines()[-1], r.stderr
    assert not (tmp_path / "out").exists()


def test_the_task_folder_is_made_private_and_must_be_this_users(tmp_path):
    """No cluster needed: the .slurm folder (submitit's pickles, run by the tasks) is 0700,
    also when it was there before with a wider mode; a link there is refused."""
    from autotune_cli.slurm import private_dir
    from autotune_cli.sweep_job import SweepInputError

    d = tmp_path / "out" / "cpu" / "tiny.slurm"
    d.mkdir(parents=True, mode=0o777)
    d.chmod(0o777)
    assert private_dir(d) == d and d.stat().st_mode & 0o777 == 0o700
    assert private_dir(d / "logs").stat().st_mode & 0o777 == 0o700
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    link = tmp_path / "out" / "cpu" / "other.slurm"
    link.symlink_to(elsewhere)
    with pytest.raises(SweepInputError, match="other.slurm: not a folder of this user"):
        private_dir(link)


def test_a_task_whose_worker_is_killed_records_how(tmp_path):
    """No cluster needed: an array task (`slurm_task.run_task`, run here as Slurm would run it)
    whose real worker is SIGKILLed records the signal, the phase and the peak memory, in the
    bundle's failure and in the task's log (its stdout)."""
    import contextlib
    import io
    import signal
    import threading

    from autotune_cli.plan import Combo
    from autotune_cli.slurm_task import run_task
    from autotune_cli.spec import DEFAULT_TOLERANCES, Budget
    from autotune_cli.sweep_job import SweepJob, SweepOptions

    combo = Combo(kernel="gated_norm_fwd", dtype="bf16", origins=("test",),
                  dims={"rows": 64, "d": 64, "group_size": 32, "has_z": 1, "norm_before_gate": 0, "has_bias": 0,
                        "is_rms": 1, "weight_fp32": 1})
    job = SweepJob([combo], budget=Budget(effort="none"), tolerances=DEFAULT_TOLERANCES, target_sku="h200",
                   bundle_name="t", spec_ref=None, options=SweepOptions(out_dir=tmp_path, cpu_dry_run=True))
    d = tmp_path / "combo"
    d.mkdir()
    (d / "job.json").write_text(json.dumps(job.worker_job(combo, [])))
    bundle = tmp_path / "cpu" / "t.json"
    bundle.parent.mkdir()  # the submitter's (-o DIR/SKU)
    (d / "task.json").write_text(json.dumps({
        "key": combo.key, "label": combo.label(), "kernel": combo.kernel, "dims": combo.dims, "dtype": combo.dtype,
        "bundle": str(bundle), "cpu_dry_run": True, "target_sku": "h200", "allow_gpu_mismatch": False,
        "force": False, "spec": None}))
    said = io.StringIO()
    outcome: list[str] = []

    def task() -> None:
        with contextlib.redirect_stdout(said):
            outcome.append(run_task(str(d)))

    thread = threading.Thread(target=task)
    thread.start()
    deadline = time.time() + 300
    while not (workers := [p for p in _pids_naming(d) if p != os.getpid()]):
        assert time.time() < deadline and thread.is_alive(), "no worker started"
        time.sleep(0.05)
    os.kill(workers[0], signal.SIGKILL)
    thread.join(timeout=300)
    assert outcome == ["failure"], said.getvalue()
    (failure,) = load_bundle(bundle).failures.values()
    assert failure.reason.startswith(f"the worker (pid {workers[0]}) was killed by signal 9 (SIGKILL: out of "
                                     "memory?) in phase 'start"), failure.reason
    assert "peak RSS" in failure.reason and f"mamba-tune: the worker (pid {workers[0]})" in said.getvalue()


def _pids_naming(path: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path) in (proc / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids
