"""Host cost per call of the project's launch path against a plain Triton launch (GPU).

    python experiments/host_cost/host_cost.py [--calls N]

For a few kernels at small shapes (where the GPU work is microseconds, so back-to-back calls
are host-bound), times N back-to-back calls on the host, three ways, with the same compiled
Triton kernel, grid and arguments:

  runtime   `mamba_tune.runtime.run(rk, args)`: the signature, the dict lookup, then Helion's
            generated host function (output allocation, grid, launcher);
  helion    that generated host function called directly;
  triton    `kernel[grid](*args, num_warps=..., num_stages=...)`, captured from the host
            function's one launch (Helion's `_launcher` hook): what a plain Triton launch costs.

Prints microseconds per call (wall clock over N calls, synchronized at the end) and the
GPU time of one call (do_bench) for scale.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

# (tuning record, layer shape) pairs: the gated norm at Nano TP2's rows, and two SSD kernels
# at a short sequence (host-bound on both sides).
CASES = [
    ("gated_norm_fwd", dict(batch=1, seqlen=256, nheads=32, headdim=64, ngroups=4, dstate=128, chunk_size=128)),
    ("gated_norm_bwd", dict(batch=1, seqlen=256, nheads=32, headdim=64, ngroups=4, dstate=128, chunk_size=128)),
    ("ssd_chunk_cumsum", dict(batch=1, seqlen=256, nheads=32, headdim=64, ngroups=4, dstate=128, chunk_size=128)),
    ("ssd_chunk_scan", dict(batch=1, seqlen=256, nheads=32, headdim=64, ngroups=4, dstate=128, chunk_size=128)),
]


def _per_call_us(fn: Any, calls: int) -> float:
    import torch

    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e6 / calls


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=2000, help="back-to-back calls per timing (default 2000)")
    a = p.parse_args(argv)
    if a.calls < 10:
        p.error(f"--calls {a.calls}: at least 10")
    import torch

    if not torch.cuda.is_available():
        print("host_cost: needs a CUDA GPU", file=sys.stderr)
        return 2
    for name, shape in CASES:
        _case(name, shape, a.calls)
    return 0


def _case(name: str, shape: dict[str, int], calls: int) -> None:
    import torch

    from autotune_cli.timing import gpu_median_ms
    from autotune_cli.tuning import get
    from mamba_tune import runtime
    from mamba_tune.keys import ModelShape

    tk = get(name)
    dims = tk.dims_for(ModelShape(**shape))
    args = tk.make_problem(dims, torch.bfloat16, torch.device("cuda"), 0).args
    rk = tk.runtime
    runtime.run(rk, args)  # compiled here, once
    host_fn = runtime.lookup(rk, args)
    launches: list[tuple[Any, Any, tuple[Any, ...], dict[str, Any]]] = []

    def capture(kernel: Any, grid: Any, *kargs: Any, **kwargs: Any) -> Any:
        launches.append((kernel, grid, kargs, kwargs))
        return kernel[grid](*kargs, **kwargs)

    host_fn(*args, _launcher=capture)
    torch.cuda.synchronize()
    if len(launches) != 1:
        print(f"{name}: {len(launches)} launches per call; the plain-Triton row needs exactly one", flush=True)
        return
    kernel, grid, kargs, kwargs = launches[0]
    extra = set(kwargs) - {"num_warps", "num_stages"}
    if extra:
        print(f"{name}: its launch passes {sorted(extra)}; the plain-Triton row is for plain launches", flush=True)
        return
    us = {
        "runtime": _per_call_us(lambda: runtime.run(rk, args), calls),
        "helion": _per_call_us(lambda: host_fn(*args), calls),
        "triton": _per_call_us(lambda: kernel[grid](*kargs, **kwargs), calls),
    }
    gpu_us = gpu_median_ms(lambda: runtime.run(rk, args), 50) * 1e3
    print(f"{name} {dims}: " + ", ".join(f"{k} {v:.1f} us" for k, v in us.items())
          + f" per call; runtime / triton {us['runtime'] / us['triton']:.2f}x; one call's GPU time {gpu_us:.1f} us",
          flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
