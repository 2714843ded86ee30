"""How many head runs should the dB/dC backward split a large group into? Time it (GPU).

    python experiments/ssd_bwd_paths/dbdc_head_splits.py [PRESET ...] [--splits 1,2,4,8,16]

`ssd_chunk_state_scan_bwd_dbdc` splits each group's heads into `head_splits` runs (a host
rule aiming at about 512 programs per dstate block), each writing fp32 partial dB and dC
that torch sums. Where a group has many heads (Mamba2 and Zamba2: one group of 80) the split
trades idle SMs against repeating the group-level GEMMs once per run and the partials'
traffic. This times the kernel with its bundle config (or the default) plus the partials'
sum at each split count, each checked against the fp32 reference with the tuner's bound,
next to mamba-ssm's kernels for the same work, at each preset's TP1 dims (bf16, batch 2,
seqlen 8192). The rule's own choice is marked with `*`.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("presets", nargs="*", default=["mamba2-2.7b", "zamba2-2.7b", "falcon-h1-0.5b"])
    p.add_argument("--splits", default="1,2,4,8,16", help="comma-separated split counts to time")
    a = p.parse_args(argv)
    try:
        counts = sorted({int(x) for x in a.splits.split(",")})
    except ValueError:
        p.error(f"--splits {a.splits!r}: expected comma-separated integers")
    if not counts or min(counts) < 1:
        p.error(f"--splits {a.splits!r}: each count must be at least 1")
    from autotune_cli.presets import MODEL_PRESETS

    unknown = [m for m in a.presets if m not in MODEL_PRESETS]
    if unknown:
        p.error(f"unknown preset(s) {', '.join(unknown)}; known: {', '.join(MODEL_PRESETS)}")

    import torch

    if not torch.cuda.is_available():
        print("dbdc_head_splits: needs a CUDA GPU", file=sys.stderr)
        return 2
    from autotune_cli.benchmarks.ssd import _bwd_call
    from autotune_cli.presets import MODEL_PRESETS
    from autotune_cli.spec import Tolerance
    from autotune_cli.timing import gpu_median_ms
    from autotune_cli.tuner import check_accuracy
    from autotune_cli.tuning import get
    from mamba_tune import runtime
    from mamba_tune.keys import ModelShape
    from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as dbdc

    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    rule = dbdc.head_splits
    tol = Tolerance(atol=0.01, factor=2.0)
    dev = torch.device("cuda")
    try:
        for preset in a.presets:
            d = MODEL_PRESETS[preset]
            shape = ModelShape(batch=2, seqlen=8192, nheads=d.nheads, headdim=d.headdim, ngroups=d.ngroups,
                               dstate=d.dstate, chunk_size=d.chunk_size)
            dims = tk.dims_for(shape)
            nchunks = -(-shape.seqlen // shape.chunk_size)
            chosen = rule(shape.batch, nchunks, shape.ngroups, shape.nheads)
            base = tk.make_baseline(dims, torch.bfloat16, dev, 0) if tk.make_baseline else None
            base_ms = gpu_median_ms(base.fn, 200) if base is not None else None
            per_group = shape.nheads // shape.ngroups
            print(f"{preset}: {per_group} heads per group, rule {chosen} run(s); mamba-ssm "
                  + (f"{base_ms:.4f} ms" if base_ms is not None else "not importable"), flush=True)
            for n in counts:
                if n > per_group:
                    continue
                dbdc.head_splits = lambda *_args, n=n: n
                problem = tk.make_problem(dims, torch.bfloat16, dev, 0)
                acc = check_accuracy(problem, runtime.run(tk.runtime, problem.args), tol)  # the record sums the runs
                ms = gpu_median_ms(lambda pr=problem: _bwd_call(tk.runtime, pr.args, True, torch.bfloat16), 200)
                ratio = f", {base_ms / ms:.2f}x mamba-ssm" if base_ms is not None else ""
                mark = "*" if n == chosen else " "
                print(f"  {mark}{n:3d} run(s): {ms:.4f} ms{ratio}; fp32 check {'ok' if acc.passed else 'FAILED'}",
                      flush=True)
                del problem
                torch.cuda.empty_cache()
    finally:
        dbdc.head_splits = rule
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
