"""The dB/dC kernel (`chunk_state_scan_bwd_dbdc`) with dC and dB in one program (sides 1) or
one program each (sides 2), timed on the GPU.

    python scripts/dbdc_sides.py [PRESET[@TP] ...]

At each preset's dims (tensor-parallel degree TP, default 1; bf16, batch 2, seqlen 8192, no z, no
seq_idx: the tuning record's problem, so the dx kernel's sums are added too) it prints, for both
forms: the kernel at its lookup's config (bundle entry, else default) and at a few others, and (two sides)
at half the rule's head-run count too; whether the two forms' outputs are bitwise equal at the
lookup's config; the tuner's fp32 check of the two-sided form; mamba-ssm's kernels for that work.
GPU time from do_bench (L2 flushed): the lookup rows through the launcher (its buffers and the
head runs' sum included), the other rows the kernel alone.
"""

from __future__ import annotations

import os
import sys

CONFIGS = [([64, 128, 64, 64], 8, 3), ([64, 128, 64, 64], 4, 3), ([64, 128, 32, 64], 4, 3),
           ([128, 128, 64, 64], 8, 2), ([64, 64, 64, 64], 4, 3), ([32, 128, 64, 64], 4, 3)]
DEFAULT = ["mamba2-2.7b", "zamba2-2.7b", "falcon-h1-0.5b", "nemotron-3-nano-30b"]


def main(argv: list[str]) -> int:
    from preset_args import run_per_preset

    return run_per_preset(argv, DEFAULT, "dbdc_sides", _one)


def _one(label: str, d, tp: int) -> None:  # noqa: ANN001 - a ModelDims
    import helion
    import torch
    from dbdc_paths import fp32_check
    from preset_args import model_shape

    from autotune_cli.timing import gpu_median_ms
    from autotune_cli.tuning import get
    from mamba_tune import runtime
    from mamba_tune.ssd import chunk_scan_chunk_state_bwd_dx as dx_kernel
    from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one

    dev = torch.device("cuda")
    shape = model_shape(d, tp)
    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    dims = tk.dims_for(shape)
    problem = tk.make_problem(dims, torch.bfloat16, dev, 0)
    _dBp, _dCp, dy, z, x, B, C, dt, dA, prev, ds, seq_idx, rows, cb, _sides = problem.args
    inputs = (dy, z, x, B, C, dt, dA, prev, ds, seq_idx)
    base = tk.make_baseline(dims, torch.bfloat16, dev, 0) if tk.make_baseline else None
    base_ms = gpu_median_ms(base.fn, 100) if base is not None else None
    nch = -(-shape.seqlen // shape.chunk_size)
    runs = one.head_splits(shape.batch, nch, shape.ngroups, shape.nheads)
    print(f"{label}: {runs} head runs; mamba-ssm " + (f"{base_ms:.4f} ms" if base_ms is not None else "-"), flush=True)
    before = set(runtime.resolutions())
    outs = {}
    for n in ("1", "2"):
        os.environ[one.SIDES_VAR] = n
        ms = gpu_median_ms(lambda: one._launch(*inputs, rows, cb), 100)
        verdict, (dB, dC) = fp32_check(problem, one._launch)
        outs[n] = (dB, dC, None if rows is None else rows.clone())
        sources = {k.split("|")[0]: v for k, v in runtime.resolutions().items() if k not in before}
        print(f"  sides {n}: lookup config {ms:.4f} ms {sources}; fp32 check {verdict}", flush=True)
    same = all(torch.equal(a, b) for a, b in zip(outs["1"], outs["2"], strict=True) if a is not None)
    print(f"  sides 1 and 2 bitwise equal at the lookup config: {same}", flush=True)
    Q, N, P = shape.chunk_size, shape.dstate, shape.headdim
    caps = (Q, N, Q, P)
    least = dx_kernel.slot_block(N, dx_kernel.SLOT_N)  # the least dstate block the kernel registers
    blocks_list = dict.fromkeys((tuple(min(b, c) for b, c in zip(bl, caps, strict=True)), w, st) for bl, w, st in CONFIGS)
    for n in (1, 2):
        for n_runs in sorted({runs, max(1, runs // 2)} if n == 2 else {runs}):
            dBp = torch.empty((n_runs, *B.shape), dtype=x.dtype if n_runs == 1 else torch.float32, device=dev)
            args = (dBp, torch.empty_like(dBp), dy, z, x, B, C, dt, dA, prev, ds, seq_idx, rows, cb, n)
            bound = tk.kernel.bind(args)
            parts = []
            for blocks, warps, stages in blocks_list:
                if blocks[1] < least:
                    continue
                try:
                    fn = bound.compile_config(helion.Config(block_sizes=list(blocks), num_warps=warps,
                                                            num_stages=stages), allow_print=False)
                    parts.append(f"{list(blocks)} w{warps} s{stages} "
                                 f"{gpu_median_ms(lambda fn=fn, args=args: fn(*args), 100):.4f}")
                except Exception as e:  # a config Helion or Triton refuses: say so, go on
                    parts.append(f"{list(blocks)} w{warps} s{stages} {type(e).__name__}")
            print(f"  sides {n}, {n_runs} runs: " + "; ".join(parts), flush=True)
    os.environ.pop(one.SIDES_VAR, None)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
