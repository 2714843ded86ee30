"""Bundles for the review tests, built with the real pydantic models (mamba_tune.bundle)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mamba_tune.bundle import (
    Accuracy,
    Bundle,
    Entry,
    Failure,
    GpuInfo,
    KernelProvenance,
    Provenance,
    Search,
    SpecRef,
    Speedup,
    Timing,
    Versions,
    entry_key,
)

H200 = GpuInfo(name="NVIDIA H200", sku="h200", arch="sm90", compute_capability="9.0", sm_count=132)
H100 = GpuInfo(name="NVIDIA H100 80GB HBM3", sku="h100", arch="sm90", compute_capability="9.0", sm_count=132)
VERSIONS = Versions(helion="1.5.0", torch="2.11.0+cu130", triton="3.6.0", cuda="13.0", driver="580.159.04",
                    python="3.12.3")
SHA_A = "a" * 64
SHA_B = "b" * 64


def norm_dims(rows: int, d: int = 4096, group_size: int = 512) -> dict[str, int]:
    return {"rows": rows, "d": d, "group_size": group_size, "has_z": 1, "norm_before_gate": 0, "has_bias": 0,
            "is_rms": 1, "weight_fp32": 1}


# How many block sizes each kernel's config has (what Helion's config check expects).
BLOCK_SIZES = {"gated_norm_fwd": 2, "gated_norm_bwd": 3}


def config(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"block_sizes": [32, 1], "num_warps": 4, "num_stages": 1, "indexing": "pointer"}
    return base | over


def entry(
    kernel: str = "gated_norm_fwd",
    dims: dict[str, int] | None = None,
    *,
    dtype: str = "bf16",
    tuned: float = 0.10,
    default: float = 0.15,
    baseline: float | None = 0.20,
    cfg: dict[str, Any] | None = None,
    tuned_at: str = "2026-11-29T12:00:00+00:00",
) -> Entry:
    return Entry(
        kernel=kernel,
        dims=dims or norm_dims(16384),
        dtype=dtype,  # type: ignore[arg-type]
        config=cfg or config(block_sizes=[32, 1, 1][:BLOCK_SIZES[kernel]]),
        timing=Timing(tuned_ms=tuned, default_ms=default, baseline_ms=baseline,
                      baseline=None if baseline is None else "mamba-ssm 2.3.2.post1", gbps=1000.0),
        speedup=Speedup(vs_default=default / tuned, vs_baseline=None if baseline is None else baseline / tuned),
        search=Search(algorithm="LFBOTreeSearch", effort="quick", configs_tried=120, seconds=60.0, seed=0,
                      budget_seconds=60),
        accuracy=Accuracy(passed=True, atol=0.01, factor=2.0, max_abs_err={"out": 0.004},
                          lowp_abs_err={"out": 0.008}, bound={"out": 0.026}),
        tuned_at=tuned_at,
    )


def failure(kernel: str = "gated_norm_bwd", dims: dict[str, int] | None = None, reason: str = "autotune failed",
            dtype: str = "bf16") -> Failure:
    return Failure(kernel=kernel, dims=dims or norm_dims(16384), dtype=dtype, reason=reason,  # type: ignore[arg-type]
                   at="2026-11-29T12:00:00+00:00")


def bundle(
    entries: list[Entry] = (),  # type: ignore[assignment]
    failures: list[Failure] = (),  # type: ignore[assignment]
    *,
    gpu: GpuInfo = H200,
    versions: Versions = VERSIONS,
    kernels: dict[str, str] | None = None,
    spec_sha: str = SHA_A,
    updated: str = "2026-11-29T12:00:00+00:00",
    git_sha: str = "1234567",
) -> Bundle:
    hashes = kernels if kernels is not None else {"gated_norm_fwd": SHA_A, "gated_norm_bwd": SHA_A}
    prov = Provenance(tool_version="0.1.0", git_sha=git_sha, created="2026-11-29T11:00:00+00:00", updated=updated,
                      gpu=gpu, versions=versions,
                      spec=SpecRef(name="nemotron-nano", path="sweeps/nemotron-nano.yaml", sha256=spec_sha),
                      kernels={k: KernelProvenance(source_sha256=v) for k, v in hashes.items()})
    return Bundle(provenance=prov, entries={e.key: e for e in entries},
                  failures={entry_key(f.kernel, f.dims, f.dtype): f for f in failures})


def write(b: Bundle, path: Path) -> Path:
    from mamba_tune.bundle import write_bundle

    write_bundle(b, path)
    return path


def assert_md_tables(md: str) -> int:
    """Every GFM table row has the header's number of cells (an unescaped '|' in a cell,
    even inside a code span, splits it); returns the number of tables seen."""
    import re

    tables = 0
    width: int | None = None
    for line in md.splitlines():
        if not line.startswith("|"):
            width = None
            continue
        cells = len(re.split(r"(?<!\\)\|", line.strip())) - 2
        if width is None:
            width, tables = cells, tables + 1
        assert cells == width, f"{cells} cells, header has {width}: {line}"
    return tables
