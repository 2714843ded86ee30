"""Does tuning the causal conv1d on the layer's own row alignment beat causal-conv1d there?

time_layouts.py found our forward slower on the layer's input (a slice of in_proj's output whose
positions sit 32 B off 128 B lines at Zamba2-2.7B) than on the dense tensor its entry was tuned
on. This runs the project's tuner (`autotune_cli.tuner.tune`: search, fp32 check, timing against
causal-conv1d's functions on the same inputs, one process) for the forward and the channel-last
backward on inputs laid out as the layer's (`row_align`, autotune_cli/tuning/conv1d.py), warm-started
from the config the runtime serves the layer now, and prints what it found next to that config's
time on the same inputs.

  python experiments/conv1d_layout/tune_on_slice.py [--seconds N] [PRESET[@TP][:BATCHxSEQLEN] ...]

Default: zamba2-2.7b:4x2048 and nemotron-3-nano-30b:2x8192. Needs a CUDA GPU and causal-conv1d.
"""

from __future__ import annotations

import argparse
import math
import sys


def layer_row_align(d_in_proj: int, offset: int, element_size: int) -> int:
    """Bytes modulo 128 between the starts of consecutive positions of xBC in the layer's
    zxbcdt (positions d_in_proj elements apart, xBC at column `offset`), at most 128."""
    return math.gcd(d_in_proj * element_size, offset * element_size, 128)


def main() -> int:
    import helion
    import torch

    prog = "tune_on_slice.py"
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU", file=sys.stderr)
        return 2
    from autotune_cli.benchmarks.layer import WIDTH, layer_shape
    from autotune_cli.presets import MODEL_PRESETS
    from autotune_cli.spec import DEFAULT_TOLERANCES, Budget
    from autotune_cli.tuner import bench_ms, tune
    from autotune_cli.tuning import get
    from mamba_tune import runtime
    from mamba_tune.conv1d import bwd_slide, fwd

    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("runs", nargs="*", metavar="PRESET[@TP][:BATCHxSEQLEN]")
    p.add_argument("--seconds", type=int, default=60, help="search budget per kernel (default 60)")
    a = p.parse_args()
    shapes = []
    for text in a.runs or ["zamba2-2.7b:4x2048", "nemotron-3-nano-30b:2x8192"]:
        head, _, bs = text.partition(":")
        name, _, tp = head.partition("@")
        if name not in MODEL_PRESETS:
            print(f"{prog}: unknown preset {name!r}; known: {', '.join(MODEL_PRESETS)}", file=sys.stderr)
            return 2
        batch, _, seqlen = (bs or "2x8192").partition("x")
        shapes.append(layer_shape(MODEL_PRESETS[name], int(tp or 1), int(batch), int(seqlen)))
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}: ms, causal-conv1d / ours in parentheses", flush=True)
    for s in shapes:
        align = layer_row_align(s.d_in_proj, s.dim, 2)
        base = {"batch": s.batch, "seqlen": s.seqlen, "dim": s.conv_dim, "width": WIDTH, "has_bias": 1,
                "has_seq_idx": 0, "has_initial_states": 0, "silu": 1, "channel_last": 1}
        for name, rk, extra in (("causal_conv1d_fwd", fwd.CAUSAL_CONV1D_FWD, {}),
                                ("causal_conv1d_bwd_slide", bwd_slide.CAUSAL_CONV1D_BWD_SLIDE,
                                 {"has_dinitial_states": 0, "has_dfinal": 0})):
            dims = {**base, **extra, "row_align": align}
            tk = get(name)
            problem = tk.make_problem(dims, torch.bfloat16, device, 0)
            served = runtime.resolve(rk, problem.args)
            bound = tk.kernel.bind(problem.args)
            cfg = bound.config_spec.default_config() if served.config is None else served.config
            fn = bound.compile_config(cfg if isinstance(cfg, helion.Config) else helion.Config(**cfg), allow_print=False)
            served_ms = bench_ms(lambda fn=fn, args=problem.args: fn(*args), device)
            out = tune(name, dims, "bf16", Budget(seconds_per_combo=a.seconds), DEFAULT_TOLERANCES["bf16"],
                       warm_start=[] if served.config is None else [served.config])
            label = f"{s.text()} row_align {align} {name}"
            if out.entry is None:
                print(f"{label}: no config ({out.failure.reason if out.failure else '?'}); served "
                      f"{served_ms:.4f}", flush=True)
                continue
            t = out.entry.timing
            base_ms = t.baseline_ms

            def ratio(ms: float, base_ms: float | None = base_ms) -> str:
                return f" ({base_ms / ms:.2f}x)" if base_ms else ""

            print(f"{label}: tuned here {t.tuned_ms:.4f}{ratio(t.tuned_ms)}; served ({served.source.split()[0]}) "
                  f"{served_ms:.4f}{ratio(served_ms)}; default {t.default_ms:.4f}; {t.baseline} "
                  f"{base_ms}; search {out.entry.search.seconds:.0f} s; config "
                  f"{ {k: out.entry.config[k] for k in ('block_sizes', 'num_warps', 'num_stages')} }", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
