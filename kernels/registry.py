"""The tunable kernels: what the sweep tunes and what the runtime loads configs for.

Each kernel file registers one `TunableKernel` per Helion kernel. The record tells the
tuner how to build inputs for a shape, how to check outputs against the fp32 reference,
what to time as a baseline; and tells the runtime which dims form the bundle key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch

DTYPE_NAMES: dict[torch.dtype, str] = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """One Mamba-2 layer's sizes after tensor parallelism, at one batch and seqlen."""

    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int
    # Packed sequences: the SSD call gets seq_idx (the norm does not depend on it).
    packed: bool = False


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

    def run(self, fn: Callable[..., Any]) -> Any:
        """Run a compiled (or ref-mode) kernel on this problem; `outputs` reads the result."""
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
    name: str
    family: str
    kernel: Any  # helion.Kernel
    # Bundle key dims, in key order. All ints (flags are 0/1).
    dims: tuple[str, ...]
    # Dims that the runtime's "nearest" rule may vary (sizes, not structure).
    size_dims: tuple[str, ...]
    # Key dims for a layer shape; None when the kernel does not apply to it.
    dims_for: Callable[[ModelShape], dict[str, int] | None]
    # Key dims from the kernel's own arguments (what the runtime sees).
    dims_from_args: Callable[[Sequence[Any]], dict[str, int]]
    make_problem: Callable[[dict[str, int], torch.dtype, torch.device, int], Problem]
    # Baseline (mamba-ssm) for the same problem, or None when it is not importable.
    make_baseline: Callable[[dict[str, int], torch.dtype, torch.device, int], Baseline | None] | None = None
    description: str = ""
    # Hand-written starting points for the search at these dims (Helion config dicts, which
    # may leave keys out): what a person would try first. They join the search's first
    # generation; the search still covers the whole space and keeps only what it measures.
    seed_configs: Callable[[dict[str, int]], list[dict[str, Any]]] | None = None
    # The kernel's default config at these dims (a config dict, which may leave keys out),
    # where Helion's own default is impractical: what a shape with no tuned entry runs, the
    # search's accuracy baseline, and what `speedup.vs_default` compares against. None:
    # Helion's default. (Helion's default for the norm backward at a 2048-wide group puts
    # 16 whole rows in one program's registers; Triton spent minutes compiling it.)
    default_config: Callable[[dict[str, int]], dict[str, Any]] | None = None

    def source_sha256(self) -> str:
        return kernel_source_sha256(self.kernel)

    def default_for(self, bound: Any, dims: dict[str, int]) -> Any:
        """The default config (a helion.Config) for a kernel bound to arguments with these dims."""
        import helion
        from helion.runtime.settings import RefMode

        if self.default_config is None or self.kernel.settings.ref_mode != RefMode.OFF:
            # (In Helion ref mode no config applies, and the config spec is empty.)
            return bound.config_spec.default_config()

        config = helion.Config.from_dict(self.default_config(dims))
        bound.config_spec.normalize(config)
        return config


def kernel_source_sha256(kernel: Any) -> str:
    fn = getattr(kernel, "fn", kernel)
    return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()


_REGISTRY: dict[str, TunableKernel] = {}


def register(tk: TunableKernel) -> TunableKernel:
    if tk.name in _REGISTRY and _REGISTRY[tk.name] is not tk:
        raise ValueError(f"kernel {tk.name!r} registered twice")
    bad = set(tk.size_dims) - set(tk.dims)
    if bad:
        raise ValueError(f"{tk.name}: size_dims {sorted(bad)} are not key dims")
    _REGISTRY[tk.name] = tk
    return tk


def _load_all() -> None:
    # Importing the kernel modules registers their kernels.
    import kernels.norm.gated  # noqa: F401
    import kernels.ssd  # noqa: F401


def all_kernels() -> dict[str, TunableKernel]:
    _load_all()
    return dict(sorted(_REGISTRY.items()))


def get(name: str) -> TunableKernel:
    kernels = all_kernels()
    if name not in kernels:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(kernels)}")
    return kernels[name]
