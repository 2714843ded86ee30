"""Time the slide conv1d backward against the runtime's two kernels (GPU).

    python experiments/conv1d_bwd_slide/time_slide.py [PRESET[@TP] ...]

At each preset's xBC conv (bf16, batch 2, seqlen 8192, channel-last, bias, SiLU, width 4; default
nemotron-3-nano-30b@1, zamba2-2.7b@1): `mamba_tune.conv1d.conv1d_backward` (the two kernels, on
their bundle entries or defaults) against the slide kernel on its default config and each of
`slide.CANDIDATES`, `do_bench` medians in ms, each checked against the two kernels' gradients.
Exits 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("presets", nargs="*", default=["nemotron-3-nano-30b@1", "zamba2-2.7b@1"])
    a = p.parse_args(argv)
    from autotune_cli.presets import MODEL_PRESETS

    wanted = [(name, int(tp or 1)) for name, _, tp in (s.partition("@") for s in a.presets)]
    unknown = [m for m, _ in wanted if m not in MODEL_PRESETS]
    if unknown:
        p.error(f"unknown preset(s) {', '.join(unknown)}; known: {', '.join(MODEL_PRESETS)}")
    import torch

    if not torch.cuda.is_available():
        print("time_slide: needs a CUDA GPU", file=sys.stderr)
        return 2
    for name, tp in wanted:
        d = MODEL_PRESETS[name]
        print(_one(f"{name}@{tp}", (d.nheads // tp) * d.headdim + 2 * (d.ngroups // tp) * d.dstate), flush=True)
    return 0


def _one(label: str, dim: int) -> str:
    import helion
    import slide
    import torch

    from autotune_cli.timing import gpu_median_ms
    from mamba_tune.conv1d import conv1d_backward

    g = torch.Generator(device="cpu").manual_seed(0)
    dev = torch.device("cuda")
    b, L, width = 2, 8192, 4

    def rows() -> torch.Tensor:  # (batch, dim, seqlen) channel-last, as Mamba2 passes xBC
        return torch.randn(b, L, dim, generator=g).to(dev, torch.bfloat16).transpose(1, 2)

    x, dout = rows(), rows()
    weight = (torch.randn(dim, width, generator=g) * 0.5).to(dev, torch.bfloat16)
    bias = torch.randn(dim, generator=g).to(dev, torch.bfloat16)
    want = conv1d_backward(x, weight, bias, dout, None, None, None, None, False, True)
    two_ms = gpu_median_ms(lambda: conv1d_backward(x, weight, bias, dout, None, None, None, None, False, True), 200)
    out = [f"{label} (dim {dim}): two kernels {two_ms:.4f} ms"]
    got = slide.conv1d_backward_slide(x, weight, bias, dout, None, None, None, False, True)
    for name, i in (("dx", 0), ("dweight", 1), ("dbias", 2)):
        err = (got[i].float() - want[i].float()).abs().max().item()
        out.append(f"{name} max diff {err:.3e}")
    dims = slide.SLIDE.dims_from_args((x, weight, bias, dout, None, None, None, x, None, width, True))
    args = (x, weight, bias, dout, None, None, None, torch.empty_like(x), None, width, True)
    bound = slide.SLIDE.kernel.bind(args)
    for label_c, cfg in [("default", slide.default_config(dims))] + [
            (f"{c}", slide.slide_config(dims, *c)) for c in slide.CANDIDATES]:
        fn = bound.compile_config(helion.Config.from_dict(cfg), allow_print=False)
        out.append(f"slide {label_c} {gpu_median_ms(lambda fn=fn: fn(*args), 200):.4f} ms")
    return "; ".join(out)


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main(sys.argv[1:]))
