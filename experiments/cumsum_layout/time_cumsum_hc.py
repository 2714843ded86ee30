"""The SSD forward's cumsum both ways, timed on the GPU: the runtime's kernel (on its bundle entry)
against the (heads, positions) candidate (cumsum_hc.py) at each block_h x num_warps, and mamba-ssm's
`_chunk_cumsum_fwd`, in one process.

    python experiments/cumsum_layout/time_cumsum_hc.py [PRESET[@TP] ...] [--json-out FILE]

At each preset's dims (tensor-parallel degree TP, default 1; bf16 dt, batch 2, seqlen 8192, dt_bias,
softplus: the layer's call) it prints each variant's do_bench median (L2 flushed) with its ratio to
mamba-ssm's, and whether the candidate's outputs are the runtime kernel's bits.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ["nemotron-3-nano-30b", "nemotron-3-nano-30b@2", "mamba2-2.7b", "zamba2-2.7b", "falcon-h1-0.5b"]
ROWS: list[dict] = []


def _one(label: str, d, tp: int) -> None:
    import helion
    import torch
    from cumsum_hc import CUMSUM_HC, args_for
    from mamba_ssm.ops.triton.ssd_chunk_state import _chunk_cumsum_fwd

    from autotune_cli.timing import gpu_median_ms
    from mamba_tune.ssd import chunk_cumsum

    nheads, chunk = d.nheads // tp, d.chunk_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.randn(2, 8192, nheads, generator=gen, device="cuda").to(torch.bfloat16)
    A = -torch.rand(nheads, generator=gen, device="cuda") * 4
    bias = torch.randn(nheads, generator=gen, device="cuda")
    kw = {"dt_bias": bias, "dt_softplus": True}
    want = chunk_cumsum.chunk_cumsum_fwd(dt, A, chunk, **kw)
    times = {"runtime": gpu_median_ms(lambda: chunk_cumsum.chunk_cumsum_fwd(dt, A, chunk, **kw), 100),
             "mamba-ssm": gpu_median_ms(lambda: _chunk_cumsum_fwd(dt, A, chunk, dt_bias=bias, dt_softplus=True), 100)}
    args = args_for(dt, A, chunk, bias, True, (0.0, float("inf")))
    bound = CUMSUM_HC.kernel.bind(args)
    same = None
    for bh in (b for b in (2, 4, 8, 16, 32) if b <= nheads):
        for warps in (1, 2, 4):
            fn = bound.compile_config(helion.Config(block_sizes=[bh], num_warps=warps), allow_print=False)
            got = fn(*args)
            ok = all(torch.equal(g, w) for g, w in zip(got, want))
            same = ok if same is None else same and ok
            times[f"hc block_h={bh} warps={warps}"] = gpu_median_ms(lambda f=fn: f(*args), 100)
    base = times["mamba-ssm"]
    best = min((k for k in times if k.startswith("hc")), key=times.get)
    print(f"{label} (nheads {nheads}, chunk {chunk}; the candidate's outputs "
          f"{'are' if same else 'are NOT'} the runtime kernel's bits):")
    for k in ("mamba-ssm", "runtime", best):
        print(f"  {k:32s} {times[k] * 1e3:8.2f} us  {base / times[k]:.2f}x of mamba-ssm")
    ROWS.append({"preset": label, "nheads": nheads, "chunk_size": chunk, "bitwise": same,
                 "gpu": torch.cuda.get_device_name(), "ms": times, "best_candidate": best})


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent / "ssd_bwd_paths"))
    from preset_args import run_with_json_out

    return run_with_json_out(argv, DEFAULT, "time_cumsum_hc", _one, ROWS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
