"""The one GPU timer: the tuner, `mamba-tune verify` and the benchmarks all time with it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def gpu_median_ms(fn: Callable[[], Any], rep_ms: int, warmup_ms: int = 25) -> float:
    """Median GPU time (ms) of `fn` with triton.testing.do_bench: L2 flushed between runs,
    about `rep_ms` ms of repetitions after `warmup_ms` ms of warm-up. do_bench calls `fn`
    once and synchronizes before it times anything, so compilation stays out of the median."""
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
