"""What machine and software a bundle was produced with (its provenance)."""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import platform
import subprocess
from pathlib import Path

from autotune_cli import __version__
from mamba_tune.bundle import GpuInfo, Versions
from mamba_tune.sku import arch_of, sku_of

PROJECT_ROOT = Path(__file__).resolve().parent.parent
CPU_DRY_RUN_GPU = GpuInfo(name="CPU (Helion ref mode dry run)", sku="cpu", arch="cpu", compute_capability="0.0",
                          sm_count=0)


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _driver_version() -> str | None:
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True)
        return out.stdout.strip().splitlines()[0] or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def versions(*, with_driver: bool = True) -> Versions:
    import torch
    import triton

    return Versions(
        helion=_version("helion"),
        torch=torch.__version__,
        triton=triton.__version__,
        cuda=torch.version.cuda,
        driver=_driver_version() if with_driver and torch.cuda.is_available() else None,
        python=platform.python_version(),
    )


def gpu_info(index: int = 0) -> GpuInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    cc = (props.major, props.minor)
    return GpuInfo(name=props.name, sku=sku_of(props.name), arch=arch_of(cc), compute_capability=f"{cc[0]}.{cc[1]}",
                   sm_count=props.multi_processor_count)


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def git_sha() -> str | None:
    """HEAD of the project checkout, with '-dirty' when kernels/ has uncommitted changes.

    A copy of the tree without its .git folder (a lent GPU machine) can name the commit
    in MAMBA_TUNE_GIT_SHA.
    """
    from mamba_tune import env

    given = env.read(env.GIT_SHA)
    if given is not None:
        return given
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "kernels"], cwd=PROJECT_ROOT,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "") if sha else None


def tool_version() -> str:
    return __version__
