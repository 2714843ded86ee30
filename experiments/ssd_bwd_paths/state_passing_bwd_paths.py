"""The state-passing backward (B2 + B3) both ways, timed on the GPU: one walk
(`chunk_state_passing_bwd`) against F2's kernel then the elementwise walk (`state_passing_bwd`).

    python experiments/ssd_bwd_paths/state_passing_bwd_paths.py [PRESET[@TP] ...]

At each preset's dims (tensor-parallel degree TP, default 1; bf16, batch 2, seqlen 8192, no z, no
seq_idx: the tuning record's problem), times the one walk (its bundle entry, else its default)
and the split (F2's kernel on its entry or default, then the walk kernel on its entry or default
and at a few other configs), each checked against the one walk's outputs, next to mamba-ssm's two
kernels for that work, and says which path `combined.split_state_passing_bwd` picks there. GPU
time from do_bench (L2 flushed), the split's host-side torch ops included.
"""

from __future__ import annotations

import sys

WALK_CONFIGS = [([16, 64], 4, 2), ([16, 32], 4, 2), ([16, 32], 2, 3), ([32, 32], 4, 2), ([32, 64], 4, 2),
                ([16, 16], 2, 2), ([64, 64], 8, 2)]
DEFAULT = ["mamba2-2.7b", "falcon-h1-0.5b", "zamba2-2.7b", "nemotron-3-nano-30b"]


def main(argv: list[str]) -> int:
    from preset_args import run_per_preset

    return run_per_preset(argv, DEFAULT, "state_passing_bwd_paths", _one)


def _one(label: str, d, tp: int) -> None:  # noqa: ANN001 - a ModelDims
    import helion
    import torch
    from preset_args import model_shape

    from autotune_cli.timing import gpu_median_ms
    from autotune_cli.tuning import get
    from mamba_tune import runtime
    from mamba_tune.keys import state_passing_bwd_dims
    from mamba_tune.ssd import chunk_state, chunk_state_passing_bwd, combined
    from mamba_tune.ssd import state_passing_bwd as split

    dev = torch.device("cuda")
    shape = model_shape(d, tp)
    tk = get("ssd_chunk_state_passing_bwd")
    dims = state_passing_bwd_dims(shape)
    problem = tk.make_problem(dims, torch.bfloat16, dev, 0)
    inputs = problem.args[2:]  # dy, z, C, dA_cumsum, prev_states, dfinal, seq_idx
    before = set(runtime.resolutions())

    def fused():
        return chunk_state_passing_bwd._launch(*inputs)

    want = fused()
    fused_ms = gpu_median_ms(fused, 200)
    base = tk.make_baseline(dims, torch.bfloat16, dev, 0) if tk.make_baseline else None
    base_ms = gpu_median_ms(base.fn, 200) if base is not None else None
    got = split._launch(*inputs)
    err = max(float((got[0].float() - want[0].float()).abs().max()),
              float((got[1].sum(0) - want[1].sum(0)).abs().max()), float((got[2] - want[2]).abs().max()))
    split_ms = gpu_median_ms(lambda: split._launch(*inputs), 200)
    picked = "split" if combined.split_state_passing_bwd(shape.batch, shape.nheads, shape.chunk_size) else "fused"
    sources = {k: v for k, v in runtime.resolutions().items() if k not in before}
    print(f"{label}: fused {fused_ms:.4f} ms, split {split_ms:.4f} ms (max diff {err:.3g}), mamba-ssm "
          + (f"{base_ms:.4f} ms" if base_ms is not None else "-")
          + f"; the rule picks {picked}; configs: {sources}", flush=True)
    # The split's parts: F2's kernel and the walk at each config.
    dy, _z, C, dA, prev, dfinal, seq_idx = inputs
    w = split.entering_weights(dA, seq_idx, dy.shape[1])
    zeros = torch.zeros_like(dA)
    f2_ms = gpu_median_ms(lambda: chunk_state._launch(C, dy, w, zeros, None), 200)
    dprev = chunk_state._launch(C, dy, w, zeros, None)
    wargs = (torch.empty_like(got[0]), torch.zeros_like(got[1]), dprev, dA, prev, dfinal, seq_idx)
    bound = split.state_passing_bwd_kernel.bind(wargs)
    parts = []
    for blocks, warps, stages in WALK_CONFIGS:
        try:
            fn = bound.compile_config(helion.Config(block_sizes=blocks, num_warps=warps, num_stages=stages),
                                      allow_print=False)
            parts.append(f"{blocks} w{warps} s{stages} {gpu_median_ms(lambda fn=fn: fn(*wargs), 200):.4f}")
        except Exception as e:  # a config Helion or Triton refuses: say so, go on
            parts.append(f"{blocks} w{warps} s{stages} {type(e).__name__}")
    print(f"  F2 part {f2_ms:.4f} ms; walk: " + "; ".join(parts), flush=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
