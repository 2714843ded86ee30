"""The conv1d forward at the Mamba-2 layer's call, timed on the GPU: the runtime's kernel (on its
bundle entry), the slide candidate (fwd_slide.py) at each config of its grid, and causal-conv1d's
`causal_conv1d_fwd_function` (what mamba-ssm's fused layer calls), in one process.

    python experiments/conv1d_fwd_slide/time_fwd_slide.py [PRESET[@TP] ...] [--json-out FILE]

At each preset's dims (tensor-parallel degree TP, default 1) and at batch 2 x 8192 and 8 x 2048
(Zamba2-2.7B: 4 x 2048), bf16, bias, SiLU, width 4, x the xBC slice of in_proj's output (rows
in_proj's width apart), it prints each variant's do_bench median (L2 flushed) with its ratio to
causal-conv1d's, and whether the candidate's output is the runtime kernel's bits. The runtime's
kernel (on its bundle entry) and the candidate are timed through their compiled host functions
alone; "runtime call" is the layer's whole call (`conv1d_forward`), so the two say what the host
path costs where a step is short.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ["nemotron-3-nano-30b", "nemotron-3-nano-30b@2", "mamba2-2.7b", "zamba2-2.7b"]
ROWS: list[dict] = []


def _one(label: str, d, tp: int) -> None:
    for batch, seqlen in ((2, 8192), (4 if label.startswith("zamba2") else 8, 2048)):
        _shape(label, d, tp, batch, seqlen)


def _shape(label: str, d, tp: int, batch: int, seqlen: int) -> None:
    import helion
    import torch
    from fwd_slide import FWD_SLIDE, GRID, slide_config
    from preset_args import model_shape

    from autotune_cli.timing import gpu_median_ms
    from mamba_tune import runtime
    from mamba_tune.conv1d import common, conv1d_forward, fwd
    from mamba_tune.keys import conv1d_fwd_dims

    try:
        from causal_conv1d.cpp_functions import causal_conv1d_fwd_function
    except ImportError:
        causal_conv1d_fwd_function = None
    shape = model_shape(d, tp, batch, seqlen)
    conv = conv1d_fwd_dims(shape)  # the layer's conv: its width and its rows' stride
    dim, stride = conv["dim"], conv["row_stride"]
    gen = torch.Generator(device="cuda").manual_seed(0)
    buf = torch.randn(batch, seqlen, stride, generator=gen, device="cuda").to(torch.bfloat16)
    x = buf[..., :dim].transpose(1, 2)  # the xBC slice of in_proj's output, channel-last
    w = (torch.randn(dim, 4, generator=gen, device="cuda") * 0.5).to(torch.bfloat16)
    bias = (torch.randn(dim, generator=gen, device="cuda") * 0.1).to(torch.bfloat16)
    want = conv1d_forward(x, w, bias, None, None, None, True)
    # The runtime's kernel on its entry, its compiled host function alone (as the candidate's below),
    # and the whole host call the layer makes (`conv1d_forward`: checks, the output, the lookup).
    rargs = (x, w, bias, None, None, common.like(x), 4, True)
    rfn = runtime.lookup(fwd.CAUSAL_CONV1D_FWD, rargs)
    times = {"runtime": gpu_median_ms(lambda: rfn(*rargs), 100),
             "runtime call": gpu_median_ms(lambda: conv1d_forward(x, w, bias, None, None, None, True), 100)}
    if causal_conv1d_fwd_function is not None:
        times["causal-conv1d"] = gpu_median_ms(lambda: causal_conv1d_fwd_function(x, w, bias, None, None, None, True),
                                               100)
    out = common.like(x)
    args = (x, w, bias, None, None, out, 4, True)
    bound = FWD_SLIDE.kernel.bind(args)
    dims = FWD_SLIDE.dims_from_args(args)
    same = True
    for cfg in GRID:
        try:  # compiled once, then timed as the runtime would call it (its host function alone)
            fn = bound.compile_config(helion.Config(**slide_config(dims, *cfg)), allow_print=False)
            fn(*args)
        except Exception as e:  # noqa: BLE001 - a config Triton refuses: said, not timed
            print(f"  slide {cfg}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            continue
        same = same and torch.equal(out, want)
        times[f"slide {cfg}"] = gpu_median_ms(lambda f=fn: f(*args), 100)
    base = times.get("causal-conv1d", times["runtime"])
    best = min((k for k in times if k.startswith("slide")), key=times.get, default=None)
    gb = x.numel() * 2 * 2 / 1e9  # x read and out written, bf16
    print(f"{label} batch {batch} x {seqlen} (dim {dim}, rows {stride} apart; the candidate's output "
          f"{'is' if same else 'is NOT'} the runtime kernel's bits):")
    for k in [k for k in ("causal-conv1d", "runtime call", "runtime", best) if k in times]:
        print(f"  {k:40s} {times[k] * 1e3:8.2f} us  {base / times[k]:.2f}x of "
              f"{'causal-conv1d' if 'causal-conv1d' in times else 'the runtime'}  {gb / (times[k] * 1e-3):6.0f} GB/s")
    ROWS.append({"preset": label, "batch": batch, "seqlen": seqlen, "dim": dim, "row_stride": stride,
                 "bitwise": same, "gpu": torch.cuda.get_device_name(), "ms": times, "best_candidate": best})


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent / "ssd_bwd_paths"))
    from preset_args import run_with_json_out

    return run_with_json_out(argv, DEFAULT, "time_fwd_slide", _one, ROWS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
