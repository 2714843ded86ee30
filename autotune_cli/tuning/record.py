"""The tuning record of a kernel: what the sweep needs beyond what the runtime declares.

A `TunableKernel` wraps the kernel's `mamba_tune.runtime.RuntimeKernel` (its key from
`mamba_tune.keys`: name, dims, `dims_for`, source; key dims from the call's arguments, default
config) and adds how to build inputs for a shape, how to
check outputs against the fp32 reference, what to time as a baseline and where the
search starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from mamba_tune.keys import ModelShape
from mamba_tune.runtime import RuntimeKernel


@dataclasses.dataclass(frozen=True)
class Problem:
    """Inputs for one tuning combo, plus what the checker and the timer need."""

    args: tuple[Any, ...]
    # fp32 reference outputs (name -> tensor), computed by autotune_cli.reference.
    reference: Callable[[], dict[str, torch.Tensor]]
    # The same reference evaluated in the low dtype (eager torch): the error bound.
    lowp_reference: Callable[[], dict[str, torch.Tensor]]
    # Kernel return value -> named outputs comparable with the references.
    outputs: Callable[[Any], dict[str, torch.Tensor]]
    # Bytes moved through device memory (each input read once, each output written once).
    bytes_moved: int
    flops: int = 0
    # Clears what a run accumulates into (a buffer a kernel adds to), before each run.
    reset: Callable[[], None] | None = None

    def run(self, fn: Callable[..., Any]) -> Any:
        """Run a compiled (or ref-mode) kernel on this problem; `outputs` reads the result."""
        if self.reset is not None:
            self.reset()
        return fn(*self.args)


def mamba_ssm_version() -> str:
    """The installed mamba-ssm's version ("?" when unknown), for naming baselines."""
    import importlib.metadata

    try:
        return importlib.metadata.version("mamba_ssm")
    except importlib.metadata.PackageNotFoundError:
        import mamba_ssm

        return getattr(mamba_ssm, "__version__", "?")


@dataclasses.dataclass(frozen=True)
class Baseline:
    name: str  # e.g. "mamba-ssm 2.3.2.post1"
    fn: Callable[[], Any]  # a closure timed with do_bench


@dataclasses.dataclass(frozen=True)
class TunableKernel:
    runtime: RuntimeKernel
    make_problem: Callable[[dict[str, int], torch.dtype, torch.device, int], Problem]
    # Baseline (mamba-ssm) for the same problem, or None when it is not importable.
    make_baseline: Callable[[dict[str, int], torch.dtype, torch.device, int], Baseline | None] | None = None
    description: str = ""
    # Hand-written starting points for the search at these dims (Helion config dicts, which
    # may leave keys out): what a person would try first. They join the search's first
    # generation; the search still covers the whole space and keeps only what it measures.
    seed_configs: Callable[[dict[str, int]], list[dict[str, Any]]] | None = None
    # Structural key dims across which a tuned config still fits (the same Helion config
    # space): warm starts take entries that differ only there (autotune_cli.warm_start).
    seed_across: tuple[str, ...] = ()

    # What the runtime declares, read through the record.

    @property
    def name(self) -> str:
        return self.runtime.name

    @property
    def family(self) -> str:
        return self.runtime.family

    @property
    def kernel(self) -> Any:
        return self.runtime.kernel

    @property
    def dims(self) -> tuple[str, ...]:
        return self.runtime.dims

    @property
    def size_dims(self) -> tuple[str, ...]:
        return self.runtime.size_dims

    @property
    def dims_for(self) -> Callable[[ModelShape], dict[str, int] | None]:
        """Key dims for a layer shape; None when the kernel does not run at it (mamba_tune.keys)."""
        return self.runtime.key.dims_for

    @property
    def dims_to_check(self) -> Callable[[ModelShape], dict[str, int] | None]:
        """Key dims to check the kernel at for a layer shape: the layer's, or a call's off the
        layers for a kernel no layer runs (mamba_tune.keys.KernelKey.dims_to_check)."""
        return self.runtime.key.dims_to_check

    @property
    def dims_from_args(self) -> Callable[[Sequence[Any]], dict[str, int]]:
        return self.runtime.dims_from_args

    @property
    def default_config(self) -> Callable[[dict[str, int]], dict[str, Any]] | None:
        return self.runtime.default_config

    def source_sha256(self) -> str:
        return self.runtime.source_sha256()

    def default_for(self, bound: Any, dims: dict[str, int]) -> Any:
        return self.runtime.default_for(bound, dims)
