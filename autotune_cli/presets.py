"""Mamba-2 layer dims of real models (from each model's published config) and GPU SKUs."""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ModelDims:
    d_model: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int


MODEL_PRESETS: dict[str, ModelDims] = {
    "nemotron-3-nano-30b": ModelDims(d_model=2688, nheads=64, headdim=64, ngroups=8, dstate=128, chunk_size=128),
    "nemotron-h-8b": ModelDims(d_model=4096, nheads=128, headdim=64, ngroups=8, dstate=128, chunk_size=128),
    "nemotron-h-47b": ModelDims(d_model=8192, nheads=256, headdim=64, ngroups=8, dstate=256, chunk_size=128),
    "nemotron-h-56b": ModelDims(d_model=8192, nheads=256, headdim=64, ngroups=8, dstate=256, chunk_size=128),
    "mamba2-2.7b": ModelDims(d_model=2560, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256),
    "zamba2-2.7b": ModelDims(d_model=2560, nheads=80, headdim=64, ngroups=1, dstate=64, chunk_size=256),
    "falcon-h1-0.5b": ModelDims(d_model=1024, nheads=24, headdim=64, ngroups=1, dstate=128, chunk_size=128),
}


def tp_degrees(dims: ModelDims) -> list[int]:
    """The tensor-parallel degrees a spec accepts for these dims: those dividing nheads and ngroups.

    (Megatron-style TP splits heads and groups across ranks; one group cannot be split.)
    """
    g = math.gcd(dims.nheads, dims.ngroups)
    return [t for t in range(1, g + 1) if g % t == 0]


@dataclasses.dataclass(frozen=True)
class GpuSku:
    sku: str
    arch: str
    # Substrings of torch.cuda.get_device_name() that identify the SKU (lower case).
    names: tuple[str, ...]


GPU_SKUS: dict[str, GpuSku] = {
    s.sku: s
    for s in (
        GpuSku("a100", "sm80", ("a100",)),
        GpuSku("a10g", "sm86", ("a10g",)),
        GpuSku("l40s", "sm89", ("l40s",)),
        GpuSku("h100", "sm90", ("h100",)),
        GpuSku("h200", "sm90", ("h200",)),
        GpuSku("gh200", "sm90", ("gh200",)),
        GpuSku("b200", "sm100", ("b200",)),
        GpuSku("gb200", "sm100", ("gb200",)),
        GpuSku("b300", "sm103", ("b300",)),
    )
}


def arch_of(compute_capability: tuple[int, int]) -> str:
    return f"sm{compute_capability[0]}{compute_capability[1]}"


def sku_of(device_name: str) -> str:
    """The SKU for a device name; the longest match wins ('gh200' over 'h200')."""
    name = device_name.lower()
    hits = [(len(n), s.sku) for s in GPU_SKUS.values() for n in s.names if n in name]
    if hits:
        return max(hits)[1]
    # Unknown GPUs still get a stable, path-safe SKU.
    words = [w for w in name.replace("nvidia", "").split() if w.isalnum()]
    return "-".join(words) or "unknown"

# Helion's search algorithms a spec's budget.algorithm (and `tune --algorithm`) may name.
SEARCH_ALGORITHMS = (
    "LFBOTreeSearch",
    "LFBOPatternSearch",
    "PatternSearch",
    "DifferentialEvolutionSearch",
    "DESurrogateHybrid",
    "RandomSearch",
)
