"""mamba-ssm's own `Mamba2` module, patched (these kernels) against unpatched (mamba-ssm's), in one process.

The module is `mamba_ssm.modules.mamba2.Mamba2(d_model, d_state, d_conv=4, expand, headdim,
ngroups, chunk_size, rmsnorm=True, use_mem_eff_path=...)` built in the benchmark dtype at a
model preset's dims (`autotune_cli.presets`), with `expand = nheads * headdim / d_model` (a
Fraction: Nemotron-3 Nano's 4096 / 2688 is not an integer) so that the module's own
`nheads = d_inner / headdim` is the preset's. With `--tp N` it is one rank's module: nheads and
ngroups divided by N, d_model whole, built without a process group (`layer.layer_shape`), so
the rows time one rank's compute; the collective that a process group adds after out_proj is
the same on both sides and left out.

One module is built (seeded) per path; ours is a deepcopy of it (the same weights). Patching
changes which functions the module looks up at call time, so the same module class runs
mamba-ssm's kernels outside `mamba_tune.patched_mamba_ssm()` and ours inside it; `side()`
checks, before each side is timed, that the patch is on for ours and off for mamba-ssm.

Rows (`STAGES`: each kind below with the suffix `_mem_eff` for `use_mem_eff_path=True`,
Mamba2's default fused path, or `_unfused` for `use_mem_eff_path=False`), each with ours_ms,
baseline_ms and ratio (= baseline_ms / ours_ms, > 1: ours faster):
- "module_fwd": the inference forward `module(u)` with autograd off, as under `torch.no_grad()`
  (do_bench median, L2 flushed); "module_fwd_wall": back-to-back calls timed on the host;
  "module_fwd_graph": back-to-back calls replayed from a CUDA graph (None for a side that
  cannot be captured).
- "module_train_step": the forward and the gradients of the input and of every parameter for
  a fixed output gradient (`torch.autograd.grad`; no optimizer); its row also carries both
  sides' peak memory of one step above what was allocated before it (MiB);
  "module_train_step_wall", "module_train_step_graph": as for the forward.
On the fused path ours is `mamba_tune.mamba_split_conv1d_scan_combined` (conv1d, SSD, gated
norm); mamba-ssm's fused call needs the causal-conv1d package, and without it the rows of
that path have baseline_ms None and say so in "baseline_note". On the unfused path the patch
replaces the SSD (`mamba_chunk_scan_combined`) and the gated norm, and the conv1d only where
causal-conv1d is not installed (the module's `causal_conv1d_fn`: causal-conv1d's when installed
on both sides; without it ours patched and torch's nn.Conv1d unpatched; the unfused rows name it
per side in "ours_conv1d" and "baseline_conv1d"); the GEMMs are the same.
"""

from __future__ import annotations

import contextlib
import copy
import fractions
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch

import mamba_tune
from autotune_cli.benchmarks.common import MODULE_STAGES as STAGES
from autotune_cli.benchmarks.common import check_bench, configs_since, graph_ms, wall_ms
from autotune_cli.benchmarks.layer import WIDTH, LayerShape
from autotune_cli.timing import gpu_median_ms
from mamba_tune import runtime
from mamba_tune.vocab import dtype_name

# Stage suffix -> Mamba2's use_mem_eff_path; the row kinds, in STAGES' order.
PATHS = {"mem_eff": True, "unfused": False}
KINDS = tuple(stage.removesuffix("_mem_eff") for stage in STAGES if stage.endswith("_mem_eff"))


def build_module(s: LayerShape, dtype: torch.dtype, device: str | torch.device, use_mem_eff_path: bool,
                 seed: int = 0) -> torch.nn.Module:
    """mamba-ssm's Mamba2 at s (one rank's heads and groups), its own init from `seed`.
    ImportError when mamba-ssm's Mamba2 cannot be imported."""
    from mamba_ssm.modules.mamba2 import Mamba2

    torch.manual_seed(seed)
    module = Mamba2(s.d_model, d_state=s.dstate, d_conv=WIDTH, expand=fractions.Fraction(s.dim, s.d_model),
                    headdim=s.headdim, ngroups=s.ngroups, chunk_size=s.chunk_size, rmsnorm=True,
                    use_mem_eff_path=use_mem_eff_path, device=device, dtype=dtype)
    if (module.nheads, module.ngroups, module.d_inner) != (s.nheads, s.ngroups, s.dim):
        raise ValueError(f"Mamba2 built nheads={module.nheads} ngroups={module.ngroups} d_inner={module.d_inner}, "
                         f"expected {s.nheads}, {s.ngroups}, {s.dim}")
    return module


def module_step(module: torch.nn.Module, u: torch.Tensor, dout: torch.Tensor, backward: bool) -> Callable[[], Any]:
    """The module's forward on u (no autograd), or with backward one training step: the forward
    and the gradients of u and of every parameter for dout."""
    params = list(module.parameters())
    x = u.detach().clone().requires_grad_(backward)

    def step() -> Any:
        with torch.set_grad_enabled(backward):
            out = module(x)
            if not backward:
                return out
            return torch.autograd.grad(out, [x, *params], dout)

    return step


@contextlib.contextmanager
def side(ours: bool) -> Iterator[None]:
    """Run the block with mamba-ssm patched (ours) or not (mamba-ssm's kernels), and check it:
    RuntimeError when the process was patched before (MAMBA_TUNE_PATCH_MAMBA_SSM) or when the
    names Mamba2 calls are not the side's."""
    from mamba_ssm.modules import mamba2

    ctx = mamba_tune.patched_mamba_ssm(strict=True) if ours else contextlib.nullcontext()
    with ctx:
        calls_ours = (mamba2.mamba_split_conv1d_scan_combined is mamba_tune.mamba_split_conv1d_scan_combined,
                      mamba2.mamba_chunk_scan_combined is mamba_tune.mamba_chunk_scan_combined)
        if mamba_tune.is_patched() != ours or calls_ours != (ours, ours):
            raise RuntimeError(f"the {'patched' if ours else 'unpatched'} side does not run "
                               f"{'mamba-tune' if ours else 'mamba-ssm'}'s kernels "
                               "(patched before the benchmark? unset MAMBA_TUNE_PATCH_MAMBA_SSM)")
        yield


def conv1d_name() -> str:
    """The conv1d Mamba2's unfused path calls now: causal-conv1d's function, or torch's nn.Conv1d."""
    from mamba_ssm.modules import mamba2

    fn = mamba2.causal_conv1d_fn
    return "torch nn.Conv1d" if fn is None else f"{fn.__module__}.{fn.__name__}"


def fused_baseline_missing() -> str | None:
    """Why mamba-ssm's fused path (use_mem_eff_path=True) cannot run here, or None when it can."""
    from mamba_ssm.ops.triton import ssd_combined

    if getattr(ssd_combined, "causal_conv1d_fwd_function", None) is None:
        return "mamba-ssm's fused path needs the causal-conv1d package (not importable)"
    return None


def _timer(kind: str, rep_ms: int) -> Callable[[Callable[[], Any]], float | None]:
    """How a row kind is timed: back-to-back on the host, replayed from a CUDA graph, or do_bench."""
    step = kind.startswith("module_train_step")
    if kind.endswith("_wall"):
        return lambda fn: wall_ms(fn, 20 if step else 50)
    if kind.endswith("_graph"):  # fewer training steps per graph: each keeps its gradients in the graph's pool
        return (lambda fn: graph_ms(fn, calls=5, reps=10)) if step else graph_ms
    return lambda fn: gpu_median_ms(fn, rep_ms, warmup_ms=max(rep_ms // 8, 5))


def _bench_path(label: str, s: LayerShape, dtype: torch.dtype, rep_ms: int, path: str,
                kinds: list[str], device: str = "cuda") -> list[dict[str, Any]]:
    from autotune_cli.benchmarks.ssd import peak_mib

    theirs = build_module(s, dtype, device, PATHS[path])
    ours = copy.deepcopy(theirs)
    gen = torch.Generator(device=device).manual_seed(1)
    u = torch.randn(s.batch, s.seqlen, s.d_model, generator=gen, device=device).to(dtype)
    dout = torch.randn(s.batch, s.seqlen, s.d_model, generator=gen, device=device).to(dtype)
    note = fused_baseline_missing() if PATHS[path] else None
    rows = []
    for kind in kinds:
        backward = kind.startswith("module_train_step")
        timer = _timer(kind, rep_ms)
        fn_ours, fn_base = module_step(ours, u, dout, backward), module_step(theirs, u, dout, backward)
        row: dict[str, Any] = {"family": "module", "model": label, "stage": f"{kind}_{path}",
                               "use_mem_eff_path": PATHS[path], "dtype": dtype_name(dtype), "shape": s.text(),
                               "ours_ms": None, "baseline_ms": None, "ratio": None, "baseline": None}
        with side(ours=True):
            if not PATHS[path]:
                row["ours_conv1d"] = conv1d_name()
            row["ours_ms"] = timer(fn_ours)
            if kind == "module_train_step":
                row["ours_peak_mib"] = peak_mib(fn_ours)
        if note is None:
            with side(ours=False):
                if not PATHS[path]:
                    row["baseline_conv1d"] = conv1d_name()
                row["baseline_ms"] = timer(fn_base)
                if kind == "module_train_step":
                    row["baseline_peak_mib"] = peak_mib(fn_base)
            row["baseline"] = "mamba-ssm"
            if row["ours_ms"] is not None and row["baseline_ms"] is not None:
                row["ratio"] = row["baseline_ms"] / row["ours_ms"]
        else:
            row["baseline_note"] = note
        rows.append(row)
        del fn_ours, fn_base
    return rows


def _bench_shape(label: str, s: LayerShape, dtype: torch.dtype, rep_ms: int,
                 stages: Collection[str]) -> list[dict[str, Any]]:
    sources = runtime.resolutions()
    rows = []
    for path in PATHS:
        kinds = [k for k in KINDS if f"{k}_{path}" in stages]
        if kinds:
            rows += _bench_path(label, s, dtype, rep_ms, path, kinds)
            torch.cuda.empty_cache()
    configs = configs_since(sources)
    for row in rows:
        row["configs"] = configs
    return rows


def bench_module(shapes: list[tuple[str, LayerShape]], dtype: torch.dtype, rep_ms: int = 200,
                 stages: Collection[str] = STAGES) -> list[dict[str, Any]]:
    """Time the module rows (default: all of `STAGES`) patched vs unpatched at each (label, shape). CUDA only."""
    check_bench("module", "module", stages, STAGES)
    return [row for label, shape in shapes for row in _bench_shape(label, shape, dtype, rep_ms, stages)]
