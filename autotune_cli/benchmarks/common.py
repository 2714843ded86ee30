"""Timing helpers shared by the benchmarks: kernel time, wall time, copy bandwidth."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

import torch

from autotune_cli.timing import gpu_median_ms

# The rows `bench --family ssd` can time (benchmarks/ssd.py documents each).
SSD_STAGES = ("chunk_cumsum", "chunk_state", "chunk_state_passing", "bmm", "bmm_seq_idx",
              "chunk_scan", "total", "total_seq_idx", "total_wall", "total_graph",
              "fwd_bwd", "fwd_bwd_wall", "fwd_bwd_graph", "fwd_bwd_seq_idx",
              "fwd_bwd_recompute", "fwd_bwd_recompute_graph", "bwd_state_passing", "bwd_dx", "bwd_dbdc", "bwd_cumsum")
# The rows `bench --family layer` can time (benchmarks/layer.py documents each).
LAYER_STAGES = ("layer_fwd", "layer_fwd_bwd", "layer_fwd_bwd_wall", "layer_fwd_bwd_graph", "layer_fwd_bwd_recompute",
                "fused_fwd", "fused_fwd_bwd", "in_proj", "conv1d", "ssd", "norm", "out_proj", "out_proj_bwd",
                "conv1d_bwd", "ssd_bwd", "norm_bwd", "norm_bwd_recompute", "in_proj_bwd")
# The rows `bench --family module` can time (benchmarks/module.py documents each): every kind for
# Mamba2's fused path (use_mem_eff_path=True, suffix _mem_eff), then for its unfused path (_unfused).
MODULE_STAGES = tuple(f"{kind}_{path}" for path in ("mem_eff", "unfused")
                      for kind in ("module_fwd", "module_fwd_wall", "module_fwd_graph", "module_train_step",
                                   "module_train_step_wall", "module_train_step_graph"))
# The rows `bench --family model` can time (benchmarks/model.py documents each).
MODEL_STAGES = ("model_train_step", "model_train_step_wall")


def check_bench(name: str, what: str, stages: Collection[str], known: Sequence[str]) -> None:
    """A `bench_<name>` call's arguments before it touches a GPU: ValueError for a stage not in
    `known` (`what`: the family's word in the message), RuntimeError without a CUDA GPU."""
    unknown = set(stages) - set(known)
    if unknown:
        raise ValueError(f"unknown {what} stage(s) {sorted(unknown)}; known: {', '.join(known)}")
    if not torch.cuda.is_available():
        raise RuntimeError(f"bench_{name} needs a CUDA GPU")


def configs_since(before: dict[str, str]) -> dict[str, str]:
    """The runtime's config resolutions (key -> source) made since `before` (a
    `runtime.resolutions()` taken earlier): what a shape's rows ran on."""
    from mamba_tune import runtime

    return {k: v for k, v in runtime.resolutions().items() if k not in before}


def recomputing(fn: Callable[[], Any]) -> Callable[[], Any]:
    """fn with the SSD's autograd forwards keeping nothing for their backward
    (`mamba_tune.ssd.combined.SAVE_INTERMEDIATES` off: every intermediate recomputed), to time
    what keeping them saves. The switch is read in the forward, on the calling thread."""
    from mamba_tune.ssd import combined

    def step() -> Any:
        keep = combined.SAVE_INTERMEDIATES
        combined.SAVE_INTERMEDIATES = False
        try:
            return fn()
        finally:
            combined.SAVE_INTERMEDIATES = keep

    return step


def wall_ms(fn: Callable[[], Any], iters: int = 200) -> float:
    """Wall time per call (ms) of back-to-back calls, host overhead and launch gaps included."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) * 1e3 / iters)
    return best


def capture(fn: Callable[[], Any], calls: int = 1) -> tuple[torch.cuda.CUDAGraph, list[Any]]:
    """Capture `calls` back-to-back calls of fn (already run once: compiled, configs resolved)
    in one CUDA graph, after a warm-up call on a side stream as capture wants. Returns the
    graph (not replayed yet) and the captured calls' outputs, which each replay rewrites."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = [fn() for _ in range(calls)]
    return graph, outputs


def _captured(fn: Callable[[], Any], calls: int) -> tuple[torch.cuda.CUDAGraph, list[Any]] | None:
    """`capture(fn, calls)` after one call of fn (compiled, configs resolved), or None if the
    calls cannot be captured."""
    fn()
    torch.cuda.synchronize()
    try:
        return capture(fn, calls)
    except RuntimeError:
        torch.cuda.synchronize()
        return None


def graph_ms(fn: Callable[[], Any], calls: int = 20, reps: int = 20) -> float | None:
    """Time per call (ms) of `calls` back-to-back calls captured in one CUDA graph and replayed:
    what wall time would be with no host work (L2 warm between calls, as in `wall_ms`).
    Median of `reps` replays. None if the calls cannot be captured."""
    captured = _captured(fn, calls)
    if captured is None:
        return None
    graph = captured[0]
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return sorted(times)[len(times) // 2]


def graph_bench_ms(fn: Callable[[], Any], rep_ms: int = 200) -> float | None:
    """do_bench median (ms, L2 flushed between runs) of one call of fn replayed from a CUDA graph:
    its GPU time with no host work in it, where `gpu_median_ms(fn)` also counts the host time of
    launches the GPU waits for (a stage of many small kernels on a slow host). None if the call
    cannot be captured."""
    captured = _captured(fn, 1)
    if captured is None:
        return None
    return gpu_median_ms(captured[0].replay, rep_ms, warmup_ms=max(rep_ms // 8, 5))


def gemm_tflops(m: int, n: int = 4096, k: int = 4096, dtype: torch.dtype = torch.bfloat16) -> float:
    """The rate (TFLOP/s) of one (m, k) x (k, n) GEMM in `dtype` (torch.mm, do_bench median): the
    compute-bound ceiling for GEMM-shaped work of m rows."""
    a = torch.randn(m, k, device="cuda").to(dtype)
    b = torch.randn(k, n, device="cuda").to(dtype)
    ms = gpu_median_ms(lambda: torch.mm(a, b), rep_ms=200)
    return 2 * m * n * k / (ms * 1e-3) / 1e12


def copy_gbps(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth (GB/s, bytes read + written): the memory-bound ceiling."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = gpu_median_ms(lambda: dst.copy_(src), rep_ms=200)
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def machine_line() -> str:
    import importlib.metadata

    import triton

    props = torch.cuda.get_device_properties(0)
    try:
        helion = importlib.metadata.version("helion")
    except importlib.metadata.PackageNotFoundError:
        helion = "?"
    try:
        import mamba_ssm

        mamba = getattr(mamba_ssm, "__version__", "?")
    except ImportError:
        mamba = "not importable"
    return (f"{props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}, triton {triton.__version__}, "
            f"helion {helion}, mamba-ssm {mamba}")
