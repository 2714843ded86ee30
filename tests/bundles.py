"""Build real, valid bundles for tests (the same pydantic models the tools use)."""

from __future__ import annotations

from typing import Any

from mamba_tune.bundle import (
    Accuracy,
    Bundle,
    Entry,
    GpuInfo,
    KernelProvenance,
    Provenance,
    Search,
    Speedup,
    Timing,
    Versions,
)
from mamba_tune.keys import all_keys
from mamba_tune.sku import Gpu

H200 = GpuInfo(name="NVIDIA H200", sku="h200", arch="sm90", compute_capability="9.0", sm_count=132)
H100 = GpuInfo(name="NVIDIA H100 80GB HBM3", sku="h100", arch="sm90", compute_capability="9.0", sm_count=132)
B200 = GpuInfo(name="NVIDIA B200", sku="b200", arch="sm100", compute_capability="10.0", sm_count=148)
VERSIONS = Versions(helion="1.5.0", torch="2.11.0", triton="3.6.0", cuda="13.0", driver="580", python="3.12.3")


# How many block sizes each kernel's config has (what Helion's config check expects).
# Block sizes each kernel takes (its config space); chunk_scan: rows, headdim, columns, dstate.
BLOCK_SIZES = {"gated_norm_fwd": 2, "gated_norm_bwd": 3, "ssd_chunk_scan": 4}


def norm_dims(rows: int = 16384, d: int = 4096, group_size: int = 512, **flags: int) -> dict[str, int]:
    dims = {"rows": rows, "d": d, "group_size": group_size, "has_z": 1, "norm_before_gate": 0, "has_bias": 0,
            "is_rms": 1, "weight_fp32": 1}
    dims.update(flags)
    return dims


def entry(kernel: str = "gated_norm_fwd", dims: dict[str, int] | None = None, dtype: str = "bf16",
          config: dict[str, Any] | None = None, tuned_ms: float = 0.1, default_ms: float = 0.2,
          baseline_ms: float | None = 0.3) -> Entry:
    return Entry(
        kernel=kernel, dims=dims or norm_dims(), dtype=dtype,  # type: ignore[arg-type]
        config=config or {"block_sizes": [8, 1, 1, 16][:BLOCK_SIZES[kernel]], "num_warps": 4, "num_stages": 1},
        timing=Timing(tuned_ms=tuned_ms, default_ms=default_ms, baseline_ms=baseline_ms,
                      baseline=None if baseline_ms is None else "mamba-ssm 2.3.2.post1"),
        speedup=Speedup(vs_default=default_ms / tuned_ms,
                        vs_baseline=None if baseline_ms is None else baseline_ms / tuned_ms),
        search=Search(algorithm="LFBOTreeSearch", effort="quick", configs_tried=100, seconds=60.0, seed=0),
        accuracy=Accuracy(passed=True, atol=0.01, factor=2.0, max_abs_err={"out": 0.01}, lowp_abs_err={"out": 0.02},
                          bound={"out": 0.05}),
        tuned_at="2026-11-29T00:00:00+00:00",
    )


def bundle(*entries: Entry, gpu: GpuInfo = H200, versions: Versions = VERSIONS,
           kernel_hashes: dict[str, str] | None = None) -> Bundle:
    kernels = sorted({e.kernel for e in entries})
    # The kernels' source hashes read from their files (mamba_tune.keys: torch-free, the
    # runtime's hash), so a child process that only builds and
    # writes a bundle (the umask test) does not import torch and helion.
    keys = all_keys()
    hashes = kernel_hashes or {k: keys[k].source_sha256() for k in kernels}
    prov = Provenance(tool_version="0.1.0", git_sha="abc", created="2026-11-29T00:00:00+00:00",
                      updated="2026-11-29T00:00:00+00:00", gpu=gpu, versions=versions,
                      kernels={k: KernelProvenance(source_sha256=hashes[k]) for k in kernels})
    return Bundle(provenance=prov, entries={e.key: e for e in entries})


def running_on(info: GpuInfo) -> Gpu:
    """The runtime's view of a GPU that a bundle says it was tuned on (name and compute capability)."""
    major, minor = info.compute_capability.split(".")
    return Gpu.of(info.name, (int(major), int(minor)))
