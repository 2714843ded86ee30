"""Time the head runs' fold in one kernel against the torch sums it would replace (GPU).

    python experiments/dbdc_runs_sum/time_runs_sum.py [PRESET ...]

At each preset's TP1 dims (bf16, batch 2, seqlen 8192) where the dB/dC kernel splits the heads
(default: mamba2-2.7b, zamba2-2.7b, falcon-h1-0.5b): the fold alone against torch's two sums and
casts, on the partials the dB/dC kernel leaves, and the whole SSD backward (forward + backward)
with each, `do_bench` medians in ms. The kernel runs its default config (it is no runtime kernel:
no bundle entry applies). Exits 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("presets", nargs="*", default=["mamba2-2.7b", "zamba2-2.7b", "falcon-h1-0.5b"])
    a = p.parse_args(argv)
    from autotune_cli.presets import MODEL_PRESETS

    unknown = [m for m in a.presets if m not in MODEL_PRESETS]
    if unknown:
        p.error(f"unknown preset(s) {', '.join(unknown)}; known: {', '.join(MODEL_PRESETS)}")
    import torch

    if not torch.cuda.is_available():
        print("time_runs_sum: needs a CUDA GPU", file=sys.stderr)
        return 2
    for preset in a.presets:
        print(_one(preset, MODEL_PRESETS[preset]), flush=True)
    return 0


def _one(preset: str, d: object) -> str:
    import torch
    from runs_sum import installed, sum_runs

    from autotune_cli.timing import gpu_median_ms
    from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as dbdc
    from mamba_tune.ssd import mamba_chunk_scan_combined

    dev = torch.device("cuda")
    b, L = 2, 8192
    runs = dbdc.head_splits(b, -(-L // d.chunk_size), d.ngroups, d.nheads)
    if runs == 1:
        return f"{preset}: one head run per group, nothing to fold"
    part = torch.randn(runs, b, L, d.ngroups, d.dstate, device=dev)
    part2 = torch.randn_like(part)
    torch_ms = gpu_median_ms(lambda: (dbdc.sum_splits(part, torch.bfloat16), dbdc.sum_splits(part2, torch.bfloat16)),
                             200)
    fold_ms = gpu_median_ms(lambda: sum_runs(part, part2, torch.bfloat16), 200)
    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g).to(dev, torch.bfloat16).requires_grad_()

    x, B, C = randn(b, L, d.nheads, d.headdim), randn(b, L, d.ngroups, d.dstate), randn(b, L, d.ngroups, d.dstate)
    dt = (torch.rand(b, L, d.nheads, generator=g) * 0.1).to(dev, torch.bfloat16).requires_grad_()
    A = (-torch.rand(d.nheads, generator=g)).to(dev).requires_grad_()
    dy = torch.randn(b, L, d.nheads, d.headdim, generator=g).to(dev, torch.bfloat16)

    def step() -> None:
        out = mamba_chunk_scan_combined(x, dt, A, B, C, d.chunk_size)
        torch.autograd.grad(out, (x, dt, A, B, C), dy)

    step_torch = gpu_median_ms(step, 500)
    with installed():
        step_fold = gpu_median_ms(step, 500)
    return (f"{preset}: {runs} runs; fold {fold_ms:.4f} ms vs torch {torch_ms:.4f} ms; "
            f"SSD fwd+bwd {step_fold:.3f} ms vs {step_torch:.3f} ms")


if __name__ == "__main__":
    sys.path.insert(0, __import__("os").path.dirname(__file__))
    sys.exit(main(sys.argv[1:]))
