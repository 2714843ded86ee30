"""dB and dC (B5-B8) both ways, timed on the GPU: the one kernel (`chunk_state_scan_bwd_dbdc`)
against the two passes (`dbdc_two_pass`: each dCB tile once, through a head-summed buffer).

    python experiments/ssd_bwd_paths/dbdc_paths.py [PRESET[@TP] ...]

At each preset's dims (tensor-parallel degree TP, default 1; bf16, batch 2, seqlen 8192, no z, no
seq_idx: the tuning record's problem, so the dx kernel's sums are added too) it prints:
- the one kernel on its bundle entry (else its default) and mamba-ssm's kernels for that work;
- the two passes on their defaults, and each pass alone at a few configs, and the two passes at
  other head-run counts;
- each path through the tuner's fp32 check (dB, dC and the sums added to the dx kernel's rows,
  each within 2x eager bf16's error + 0.01).
GPU time from do_bench (L2 flushed), the host's buffer allocations included in the whole rows.
"""

from __future__ import annotations

import sys

DCB_CONFIGS = [([64, 128, 64, 64], 8, 3), ([64, 128, 32, 64], 8, 2), ([32, 128, 64, 64], 4, 3),
               ([64, 64, 64, 64], 4, 3), ([128, 128, 64, 64], 8, 2), ([64, 128, 64, 32], 8, 3)]
DBDC_CONFIGS = [([64, 64, 128], 4, 3), ([32, 64, 128], 4, 3), ([64, 64, 64], 4, 3), ([64, 32, 128], 4, 2),
                ([128, 64, 64], 8, 3), ([32, 32, 64], 4, 3)]
DEFAULT = ["mamba2-2.7b", "zamba2-2.7b", "falcon-h1-0.5b", "nemotron-3-nano-30b"]


def main(argv: list[str]) -> int:
    from preset_args import run_per_preset

    return run_per_preset(argv, DEFAULT, "dbdc_paths", _one)


def fp32_check(problem, launch) -> tuple[str, tuple]:  # noqa: ANN001 - the tuning record's Problem, a dB/dC launcher
    """The tuner's check of `launch` (`chunk_state_scan_bwd_dbdc._launch`'s signature) on the dB/dC
    tuning record's problem: each output within 2x eager bf16's error + 0.01 of the fp32
    reference. Returns the verdict line ("ok: ..." or "FAILED: ...") and the outputs (dB, dC)."""
    from autotune_cli.spec import Tolerance
    from autotune_cli.tuner import check_accuracy

    dB, dC = problem.run(lambda *args: launch(*args[2:14]))  # the rows' sums start from zero
    acc = check_accuracy(problem, (dB[None], dC[None]), Tolerance(atol=0.01, factor=2.0))
    errs = ", ".join(f"{k} {v:.3g} (bound {acc.bound[k]:.3g})" for k, v in acc.max_abs_err.items())
    return f"{'ok' if acc.passed else 'FAILED'}: {errs}", (dB, dC)


def _one(label: str, d, tp: int) -> None:  # noqa: ANN001 - a ModelDims
    import helion
    import torch
    from preset_args import model_shape

    from autotune_cli.timing import gpu_median_ms
    from autotune_cli.tuning import get
    from mamba_tune import runtime
    from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one
    from mamba_tune.ssd import dbdc_two_pass as two

    dev = torch.device("cuda")
    shape = model_shape(d, tp)
    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    dims = tk.dims_for(shape)
    problem = tk.make_problem(dims, torch.bfloat16, dev, 0)
    _dBp, _dCp, dy, z, x, B, C, dt, dA, prev, ds, seq_idx, rows, cb, _sides = problem.args
    inputs = (dy, z, x, B, C, dt, dA, prev, ds, seq_idx)
    before = set(runtime.resolutions())

    one_ms = gpu_median_ms(lambda: one._launch(*inputs, rows, cb), 100)
    two_ms = gpu_median_ms(lambda: two._launch(*inputs, rows, cb), 100)
    base = tk.make_baseline(dims, torch.bfloat16, dev, 0) if tk.make_baseline else None
    base_ms = gpu_median_ms(base.fn, 100) if base is not None else None
    runs = two.head_splits(shape.batch, -(-shape.seqlen // shape.chunk_size), shape.ngroups, shape.nheads)
    sources = {k: v for k, v in runtime.resolutions().items() if k not in before}
    print(f"{label}: one kernel {one_ms:.4f} ms, two passes {two_ms:.4f} ms ({runs} head runs), mamba-ssm "
          + (f"{base_ms:.4f} ms" if base_ms is not None else "-") + f"; configs: {sources}", flush=True)
    print(f"  fp32 check, one kernel {fp32_check(problem, one._launch)[0]}", flush=True)
    print(f"  fp32 check, two passes {fp32_check(problem, two._launch)[0]}", flush=True)
    # Each pass alone at a few configs, on the head-run count of the rule.
    S = torch.empty((runs, shape.batch, shape.ngroups, shape.seqlen, shape.chunk_size), dtype=x.dtype, device=dev)
    dBs = torch.empty((runs, shape.batch, shape.seqlen, shape.ngroups, shape.dstate), dtype=torch.float32, device=dev)
    dCs = torch.empty_like(dBs)
    a1 = (S, dBs, dCs, dy, z, x, C, dt, dA, prev, ds, seq_idx, rows, cb)
    a2 = (torch.empty_like(B), torch.empty_like(C), S, dBs, dCs, B, C)
    Q, N, P = shape.chunk_size, shape.dstate, shape.headdim
    for name, kernel, args, configs, caps in (("dcb", two.dcb_kernel, a1, DCB_CONFIGS, (Q, N, Q, P)),
                                              ("dbdc", two.dbdc_kernel, a2, DBDC_CONFIGS, (Q, Q, N))):
        bound = kernel.bind(args)
        parts = []
        # Each config's blocks cut to their dims (Zamba2's dstate is 64), each distinct one timed once.
        for blocks, warps, stages in dict.fromkeys((tuple(min(b, c) for b, c in zip(bl, caps, strict=True)), w, st)
                                                   for bl, w, st in configs):
            try:
                fn = bound.compile_config(helion.Config(block_sizes=list(blocks), num_warps=warps,
                                                        num_stages=stages), allow_print=False)
                parts.append(f"{list(blocks)} w{warps} s{stages} {gpu_median_ms(lambda fn=fn, args=args: fn(*args), 100):.4f}")
            except Exception as e:  # a config Helion or Triton refuses: say so, go on
                parts.append(f"{list(blocks)} w{warps} s{stages} {type(e).__name__}")
        print(f"  {name}: " + "; ".join(parts), flush=True)
    # Other head-run counts (defaults).
    rule = two.head_splits
    heads_per_group = shape.nheads // shape.ngroups
    parts = []
    try:
        for n in sorted({max(1, runs // 2), runs * 2, heads_per_group} - {runs}):
            if n > heads_per_group:
                continue
            two.head_splits = lambda *_a, n=n: n
            parts.append(f"{n} runs {gpu_median_ms(lambda: two._launch(*inputs, rows, cb), 100):.4f}")
    finally:
        two.head_splits = rule
    print("  two passes at other head-run counts: " + ("; ".join(parts) or "-"), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
