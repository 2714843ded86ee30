"""dB and dC (B5-B8) both ways, timed on the GPU: the one kernel (`chunk_state_scan_bwd_dbdc`)
against the two passes (`dbdc_two_pass`: each dCB tile once, through a head-summed buffer).

    python scripts/dbdc_paths.py [PRESET[@TP] ...]

At each preset's dims (tensor-parallel degree TP, default 1; bf16, batch 2, seqlen 8192, no z, no
seq_idx: the tuning record's problem, so the dx kernel's sums are added too) it prints:
- the one kernel on its bundle entry (else its default) and mamba-ssm's kernels for that work;
- the two passes on their defaults, and each pass alone at a few configs, and the two passes at
  other head-run counts;
- each path's largest error against the fp32 reference (dB, dC, and the sums added to the dx
  kernel's rows), next to eager bf16's error, the bound the tuner applies (2x it + atol).
GPU time from do_bench (L2 flushed), the host's buffer allocations included in the whole rows.
"""

from __future__ import annotations

import re
import sys

DCB_CONFIGS = [([64, 128, 64, 64], 8, 3), ([64, 128, 32, 64], 8, 2), ([32, 128, 64, 64], 4, 3),
               ([64, 64, 64, 64], 4, 3), ([128, 128, 64, 64], 8, 2), ([64, 128, 64, 32], 8, 3)]
DBDC_CONFIGS = [([64, 64, 128], 4, 3), ([32, 64, 128], 4, 3), ([64, 64, 64], 4, 3), ([64, 32, 128], 4, 2),
                ([128, 64, 64], 8, 3), ([32, 32, 64], 4, 3)]
DEFAULT = ["mamba2-2.7b", "zamba2-2.7b", "falcon-h1-0.5b", "nemotron-3-nano-30b"]


def main(argv: list[str]) -> int:
    from autotune_cli.presets import MODEL_PRESETS, tp_degrees

    wanted = []
    for arg in argv or DEFAULT:
        m = re.fullmatch(r"([\w.-]+?)(?:@(\d+))?", arg)
        name, tp = (m.group(1), int(m.group(2) or 1)) if m else (arg, 1)
        if name not in MODEL_PRESETS:
            print(f"dbdc_paths: unknown preset {name!r} in {arg!r}; known: {', '.join(MODEL_PRESETS)}",
                  file=sys.stderr)
            return 2
        if tp not in tp_degrees(MODEL_PRESETS[name]):
            print(f"dbdc_paths: {arg!r}: TP {tp} does not divide {name}'s heads and groups "
                  f"(allowed: {tp_degrees(MODEL_PRESETS[name])})", file=sys.stderr)
            return 2
        wanted.append((arg, MODEL_PRESETS[name], tp))
    import torch

    if not torch.cuda.is_available():
        print("dbdc_paths: needs a CUDA GPU", file=sys.stderr)
        return 2
    for label, dims, tp in wanted:
        _one(label, dims, tp)
        torch.cuda.empty_cache()
    return 0


def _errors(got: dict, ref: dict) -> str:
    return ", ".join(f"{k} {float((got[k].float() - ref[k].float()).abs().max()):.3g}" for k in ref)


def _one(label: str, d, tp: int) -> None:  # noqa: ANN001 - a ModelDims
    import helion
    import torch

    from autotune_cli.kernel_keys import ModelShape
    from autotune_cli.timing import gpu_median_ms
    from autotune_cli.tuning import get
    from mamba_tune import runtime
    from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one
    from mamba_tune.ssd import dbdc_two_pass as two

    dev = torch.device("cuda")
    shape = ModelShape(batch=2, seqlen=8192, nheads=d.nheads // tp, headdim=d.headdim, ngroups=d.ngroups // tp,
                       dstate=d.dstate, chunk_size=d.chunk_size)
    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    dims = tk.dims_for(shape)
    problem = tk.make_problem(dims, torch.bfloat16, dev, 0)
    _dBp, _dCp, dy, z, x, B, C, dt, dA, prev, ds, seq_idx, rows, cb = problem.args
    inputs = (dy, z, x, B, C, dt, dA, prev, ds, seq_idx)
    ref, low = problem.reference(), problem.lowp_reference()
    before = set(runtime.resolutions())

    def outputs(launch) -> dict:  # noqa: ANN001
        r = rows.clone()
        dB, dC = launch(*inputs, r, cb)
        torch.cuda.synchronize()
        s = r.sum(1)
        return {"dB": dB, "dC": dC, "ddt_chunk": s[0], "dout_y": s[2]}

    one_ms = gpu_median_ms(lambda: one._launch(*inputs, rows, cb), 100)
    two_ms = gpu_median_ms(lambda: two._launch(*inputs, rows, cb), 100)
    base = tk.make_baseline(dims, torch.bfloat16, dev, 0) if tk.make_baseline else None
    base_ms = gpu_median_ms(base.fn, 100) if base is not None else None
    runs = two.head_splits(shape.batch, -(-shape.seqlen // shape.chunk_size), shape.ngroups, shape.nheads)
    sources = {k: v for k, v in runtime.resolutions().items() if k not in before}
    print(f"{label}: one kernel {one_ms:.4f} ms, two passes {two_ms:.4f} ms ({runs} head runs), mamba-ssm "
          + (f"{base_ms:.4f} ms" if base_ms is not None else "-") + f"; configs: {sources}", flush=True)
    print(f"  max error vs fp32: one [{_errors(outputs(one._launch), ref)}]; two [{_errors(outputs(two._launch), ref)}]; "
          f"eager bf16 [{_errors(low, ref)}]", flush=True)
    # Each pass alone at a few configs, on the head-run count of the rule.
    S = torch.empty((runs, shape.batch, shape.ngroups, shape.seqlen, shape.chunk_size), dtype=x.dtype, device=dev)
    dBs = torch.empty((runs, shape.batch, shape.seqlen, shape.ngroups, shape.dstate), dtype=torch.float32, device=dev)
    dCs = torch.empty_like(dBs)
    a1 = (S, dBs, dCs, dy, z, x, C, dt, dA, prev, ds, seq_idx, rows, cb)
    a2 = (torch.empty_like(B), torch.empty_like(C), S, dBs, dCs, B, C)
    for name, kernel, args, configs in (("dcb", two.dcb_kernel, a1, DCB_CONFIGS),
                                        ("dbdc", two.dbdc_kernel, a2, DBDC_CONFIGS)):
        bound = kernel.bind(args)
        parts = []
        for blocks, warps, stages in configs:
            try:
                fn = bound.compile_config(helion.Config(block_sizes=blocks, num_warps=warps, num_stages=stages),
                                          allow_print=False)
                parts.append(f"{blocks} w{warps} s{stages} {gpu_median_ms(lambda fn=fn, args=args: fn(*args), 100):.4f}")
            except Exception as e:  # a config Helion or Triton refuses: say so, go on
                parts.append(f"{blocks} w{warps} s{stages} {type(e).__name__}")
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
