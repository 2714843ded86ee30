"""mamba-ssm's `Mamba2` training step (default fused path) with the fused F2 + F3 + F5 candidate
installed, against the runtime's kernels and against mamba-ssm, in one process on a GPU.

    python experiments/fused_fwd_scan/time_module_fused.py [PRESET[@TP] ...] [--config P,M,K,S,WARPS]

At each preset's dims (bf16, batch 2, seqlen 8192): the training step (forward and every
gradient) and the inference forward, do_bench medians with L2 flushed, patched with and without
`installed()`, and unpatched (mamba-ssm with causal-conv1d). The candidate runs `--config`
(default: its default config); time_scan_fused.py finds the best one.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ["nemotron-3-nano-30b"]
CONFIG: list = []


def _one(label: str, d, tp: int) -> None:
    import helion
    import torch
    from scan_fused import installed

    from autotune_cli.benchmarks.layer import layer_shape
    from autotune_cli.benchmarks.module import build_module, module_step, side
    from autotune_cli.timing import gpu_median_ms

    s = layer_shape(d, tp, 2, 8192)
    config = None
    if CONFIG:
        p, m, k, st, w = CONFIG
        config = helion.Config(block_sizes=[p, m, k, st], num_warps=w, num_stages=2)
    u = torch.randn(2, 8192, s.d_model, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(u)
    times = {}
    for name, ours, fused in (("mamba-ssm", False, False), ("runtime", True, False), ("fused", True, True)):
        with side(ours):
            module = build_module(s, torch.bfloat16, "cuda", True)
            for kind, backward in (("step", True), ("forward", False)):
                step = module_step(module, u, dout, backward)
                if fused:
                    with installed(config):
                        times[f"{kind} {name}"] = gpu_median_ms(step, 300)
                else:
                    times[f"{kind} {name}"] = gpu_median_ms(step, 300)
    print(f"{label} b2 L8192 on {torch.cuda.get_device_name()} (ms; ratio = mamba-ssm / this):", flush=True)
    for kind in ("step", "forward"):
        base = times[f"{kind} mamba-ssm"]
        print("  " + "  ".join(f"{kind} {n} {times[f'{kind} {n}']:.3f} ({base / times[f'{kind} {n}']:.3f}x)"
                               for n in ("mamba-ssm", "runtime", "fused")), flush=True)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent / "ssd_bwd_paths"))
    from preset_args import run_per_preset

    if "--config" in argv:
        i = argv.index("--config")
        try:
            CONFIG.extend(int(v) for v in argv[i + 1].split(","))
            assert len(CONFIG) == 5
        except (IndexError, ValueError, AssertionError):
            print("time_module_fused: --config needs P,M,K,S,WARPS (five integers)", file=sys.stderr)
            return 2
        argv = argv[:i] + argv[i + 2:]
    return run_per_preset(argv, DEFAULT, "time_module_fused", _one)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
