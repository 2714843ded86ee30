"""Mamba-2 layer dims of real models (from each model's published config) and search algorithms.

GPU SKUs live in `mamba_tune.sku` (the runtime names its GPU with the same rule)."""

from __future__ import annotations

import dataclasses
import math

# The shape `mamba-tune bench` measures at unless told otherwise, and that `mamba-tune results`
# leaves unlabelled: the reference layer's batch 2 x 8192, one sequence for a whole model's step.
BENCH_SEQLEN = 8192


def bench_batch(family: str) -> int:
    """bench's default batch for a family ("model": a whole model's step; else the layer's)."""
    return 1 if family == "model" else 2


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


# Helion's search algorithms a spec's budget.algorithm (and `tune --algorithm`) may name.
SEARCH_ALGORITHMS = (
    "LFBOTreeSearch",
    "LFBOPatternSearch",
    "PatternSearch",
    "DifferentialEvolutionSearch",
    "DESurrogateHybrid",
    "RandomSearch",
)
