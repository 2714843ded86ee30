"""One array task of the Slurm executor (`autotune_cli.slurm`), on the compute node.

`run_task(<combo dir>)` (pickled by submitit) exits early when the key is already in the
bundle, else runs the local executor's worker (`python -m autotune_cli.worker`, the same job
and result files) and merges its result into the bundle under the bundle's lock
(`autotune_cli.bundle_lock`; `write_bundle` is atomic), then writes merged.json.
`merge_result` also serves the submitter, for a task killed after writing its result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from autotune_cli import environment as env
from autotune_cli.bundle_lock import bundle_lock
from autotune_cli.sweep_job import BundleWriter, SweepInputError, same_versions, worker_death
from mamba_tune.bundle import (
    BundleError,
    Entry,
    Failure,
    GpuInfo,
    KernelProvenance,
    SpecRef,
    Versions,
    load_bundle,
)
from mamba_tune.sku import GPU_SKUS

# How long a task waits for the bundle's lock before it gives up (a local sweep may hold it).
MERGE_LOCK_TIMEOUT_S = 3600.0


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _task_environment(task: dict[str, Any]) -> tuple[GpuInfo, Versions]:
    if task["cpu_dry_run"]:
        return env.CPU_DRY_RUN_GPU, env.versions(with_driver=False)
    if env.cuda_device_count() == 0:
        raise SweepInputError("no CUDA GPU in this Slurm task (ask for one with --slurm-gpus-per-task)")
    gpu = env.gpu_info(0)
    want = GPU_SKUS[task["target_sku"]]
    if (gpu.sku != want.sku or gpu.arch != want.arch) and not task["allow_gpu_mismatch"]:
        raise SweepInputError(f"the spec targets {want.sku} ({want.arch}) but this task's GPU is {gpu.name} "
                              f"({gpu.arch}); pass --allow-gpu-mismatch to tune for it anyway")
    return gpu, env.versions()


def record_from_result(task: dict[str, Any], result: dict[str, Any], log: str
                       ) -> tuple[Entry | None, Failure | None, KernelProvenance | None]:
    """The bundle record for a worker's result file (the format autotune_cli.worker writes)."""
    if "error" in result:
        failure = Failure(kernel=task["kernel"], dims=task["dims"], dtype=task["dtype"],
                          reason=f"{result['error']} (log: {log})", at=env.now())
        return None, failure, None
    kernel = KernelProvenance.model_validate(result["kernel"])
    if result["entry"] is not None:
        return Entry.model_validate(result["entry"]), None, kernel
    return None, Failure.model_validate(result["failure"]), kernel


def merge_result(combo_dir: Path, log: str = "") -> dict[str, Any]:
    """Merge a combo's result.json into its bundle under the bundle's lock; write merged.json.
    Returns merged.json's content: {"outcome": "entry" | "failure" | "kept" | "error", ...}."""
    task = json.loads((combo_dir / "task.json").read_text())
    result = read_json(combo_dir / "result.json")
    if result is None:
        raise FileNotFoundError(f"{combo_dir / 'result.json'}: no result to merge")
    bundle_path = Path(task["bundle"])
    try:
        entry, failure, kprov = record_from_result(task, result, log or task.get("log", ""))
        spec = SpecRef.model_validate(task["spec"]) if task.get("spec") else None
        with bundle_lock(bundle_path, timeout=MERGE_LOCK_TIMEOUT_S):
            bundle = load_bundle(bundle_path) if bundle_path.exists() else None
            if "gpu" in result:  # what the task ran on
                gpu, versions = GpuInfo.model_validate(result["gpu"]), Versions.model_validate(result["versions"])
            elif bundle is not None:  # a failure the submitter records (the task died): the bundle's own
                gpu, versions = bundle.provenance.gpu, bundle.provenance.versions
            else:
                gpu, versions = _task_environment(task)
            if bundle is not None:
                old = bundle.provenance
                if old.gpu.name != gpu.name or not same_versions(old.versions, versions):
                    raise SweepInputError(
                        f"{bundle_path} holds {old.gpu.name} with helion {old.versions.helion}, torch "
                        f"{old.versions.torch}; this task ran on {gpu.name} with helion {versions.helion}, torch "
                        f"{versions.torch}: not merged (result kept in {combo_dir})")
            if bundle is not None and task["key"] in bundle.entries and entry is None:
                outcome = {"outcome": "kept", "reason": "the bundle already has an entry for this key"}
            else:
                BundleWriter(bundle_path, bundle, gpu, versions, spec).save(entry, failure, kprov)
                outcome = ({"outcome": "entry", "tuned_ms": entry.timing.tuned_ms} if entry is not None
                           else {"outcome": "failure", "reason": failure.reason if failure else "?"})
    except (SweepInputError, BundleError, ValueError, KeyError) as e:
        outcome = {"outcome": "error", "reason": str(e)}
    outcome["at"] = env.now()
    tmp = combo_dir / ".merged.json.tmp"
    tmp.write_text(json.dumps(outcome))
    os.replace(tmp, combo_dir / "merged.json")
    return outcome


def run_task(combo_dir_text: str) -> str:
    """One array task (runs on the compute node, pickled by submitit): tune one combo with the
    local executor's worker and merge its result into the bundle."""
    combo_dir = Path(combo_dir_text)
    task = json.loads((combo_dir / "task.json").read_text())
    bundle_path = Path(task["bundle"])
    if not task["force"] and bundle_path.exists():
        try:
            if task["key"] in load_bundle(bundle_path).entries:
                print(f"{task['key']}: already in {bundle_path}; nothing to do", flush=True)
                merged = {"outcome": "kept", "reason": "already in the bundle", "at": env.now()}
                (combo_dir / "merged.json").write_text(json.dumps(merged))
                return "kept"
        except BundleError:
            pass
    log = os.environ.get("SUBMITIT_LOG", task.get("log", ""))
    if read_json(combo_dir / "result.json") is None:
        try:
            gpu, versions = _task_environment(task)
        except SweepInputError as e:
            result: dict[str, Any] = {"error": str(e)}
        else:
            child_env = dict(os.environ)
            root = str(Path(__file__).resolve().parent.parent)
            child_env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [child_env.get("PYTHONPATH")])])
            child_env["PYTHONUNBUFFERED"] = "1"
            if task["cpu_dry_run"]:
                child_env["HELION_INTERPRET"] = "1"
            print(f"tuning {task['label']} (worker: python -m autotune_cli.worker)", flush=True)
            t0 = time.monotonic()
            proc = subprocess.Popen([sys.executable, "-m", "autotune_cli.worker", str(combo_dir / "job.json"),
                                     str(combo_dir / "result.json.worker"), str(combo_dir / "status.json")],
                                    env=child_env)
            _, status, usage = os.wait4(proc.pid, 0)  # wait4: its peak memory too
            proc.returncode = os.waitstatus_to_exitcode(status)
            result = read_json(combo_dir / "result.json.worker")
            if result is None:
                phase = (read_json(combo_dir / "status.json") or {}).get("phase")
                death = worker_death(proc.pid, proc.returncode, phase, time.monotonic() - t0,
                                     usage.ru_maxrss / 1024)  # kilobytes on Linux
                print(f"mamba-tune: {death}", flush=True)  # into the task's log
                result = {"error": f"{death}; no result"}
            result["gpu"] = gpu.model_dump(mode="json")
            result["versions"] = versions.model_dump(mode="json")
        tmp = combo_dir / ".result.json.tmp"
        tmp.write_text(json.dumps(result))
        os.replace(tmp, combo_dir / "result.json")
    outcome = merge_result(combo_dir, log)
    print(f"{task['key']}: {outcome}", flush=True)
    return str(outcome["outcome"])
