"""The fused F2 + F3 + F5 candidate (scan_fused.py) timed on the GPU against the runtime's F2 + F3
(chunk_state_passing) then F5 (chunk_scan) on their bundle entries, in one process.

    python experiments/fused_fwd_scan/time_scan_fused.py [PRESET[@TP] ...] [--json-out FILE]

At each preset's dims (bf16, batch 2, seqlen 8192, D, no z: the fused layer's SSD call) F1 and F4
run once (both paths share them); then the runtime's two kernels and the candidate at each config
of a small grid (the first preset's four best configs at the later presets), do_bench medians
with L2 flushed, the candidate with and without writing the entering states. Prints the best
config's time and ratio, and the largest difference of its output from the runtime's.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ["nemotron-3-nano-30b", "nemotron-3-nano-30b@8", "mamba2-2.7b", "zamba2-2.7b"]
ROWS: list[dict] = []
GRID = [([p, m, k, s], w) for p in (16, 32, 64) for (m, k, s) in ((64, 32, 64), (128, 64, 64), (64, 64, 128))
        for w in (4, 8)]
BEST: list = []


def _one(label: str, d, tp: int) -> None:
    import helion
    import torch
    from scan_fused import args_for, state_scan_kernel

    from autotune_cli.timing import gpu_median_ms
    from mamba_tune.ssd import bmm, chunk_cumsum, chunk_scan, chunk_state_passing

    nheads, ngroups, chunk = d.nheads // tp, d.ngroups // tp, d.chunk_size
    batch, seqlen, headdim, dstate = 2, 8192, d.headdim, d.dstate
    gen = torch.Generator(device="cuda").manual_seed(0)
    bf = torch.bfloat16
    x = torch.randn(batch, seqlen, nheads, headdim, generator=gen, device="cuda").to(bf)
    dt = (torch.rand(batch, seqlen, nheads, generator=gen, device="cuda") * 0.1).to(bf)
    A = -torch.rand(nheads, generator=gen, device="cuda") * 4
    B = torch.randn(batch, seqlen, ngroups, dstate, generator=gen, device="cuda").to(bf)
    C = torch.randn(batch, seqlen, ngroups, dstate, generator=gen, device="cuda").to(bf)
    D = torch.randn(nheads, generator=gen, device="cuda")
    bias = torch.randn(nheads, generator=gen, device="cuda") * 0.1
    dA, dt_out = chunk_cumsum._launch(dt, A, chunk, bias, True, (0.0, float("inf")))
    cb = bmm._launch(C, B, chunk, None)

    def runtime_path():
        states, final = chunk_state_passing._launch(B, x, dt_out, dA, None, None, x.dtype)
        return chunk_scan._launch(x, cb, None, C, dt_out, dA, states, D, None, None), final

    want_y, want_final = runtime_path()
    times = {"runtime F2+F3, F5": gpu_median_ms(runtime_path, 100)}
    sp = lambda: chunk_state_passing._launch(B, x, dt_out, dA, None, None, x.dtype)  # noqa: E731
    times["runtime F2+F3"] = gpu_median_ms(sp, 100)
    errs: dict[str, float] = {}

    def timed(configs: list, keep: bool) -> list:
        """Time each config (the entering states written with keep); returns those that ran, fastest first."""
        args = args_for(x, cb, B, C, dt_out, dA, D, None, None, keep)
        bound = state_scan_kernel.bind(args)
        ran = {}
        for bs, w in configs:
            name = f"fused p={bs[0]} m={bs[1]} k={bs[2]} s={bs[3]} warps={w}" + (" +states" if keep else "")
            try:
                fn = bound.compile_config(helion.Config(block_sizes=bs, num_warps=w, num_stages=2), allow_print=False)
                y, final = fn(*args)
            except Exception as e:  # a config that does not compile or launch here
                print(f"  {name}: {type(e).__name__}", flush=True)
                continue
            errs[name] = max((y.float() - want_y.float()).abs().max().item(),
                             (final - want_final).abs().max().item())
            times[name] = gpu_median_ms(lambda f=fn, a=args: f(*a), 100)
            ran[name] = (bs, w)
        return [ran[k] for k in sorted(ran, key=times.get)]

    ranked = timed(BEST[:4] if BEST else GRID, keep=False)
    if not ranked:
        raise RuntimeError("no config of the grid ran")
    if not BEST:
        BEST.extend(ranked)
    timed(ranked[:1], keep=True)
    base = times["runtime F2+F3, F5"]
    fused = sorted((k for k in times if k.startswith("fused") and "+states" not in k), key=times.get)
    print(f"{label} (nheads {nheads}, ngroups {ngroups}, chunk {chunk}, dstate {dstate}) on "
          f"{torch.cuda.get_device_name()}:", flush=True)
    for k in ["runtime F2+F3, F5", "runtime F2+F3", *fused[:3], *(k for k in times if "+states" in k)]:
        print(f"  {k:52s} {times[k] * 1e3:8.1f} us  {base / times[k]:.3f}x  max|diff| {errs.get(k, 0):.3g}",
              flush=True)
    ROWS.append({"preset": label, "nheads": nheads, "ngroups": ngroups, "chunk_size": chunk, "dstate": dstate,
                 "gpu": torch.cuda.get_device_name(), "ms": times, "max_abs_diff": errs})


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent / "ssd_bwd_paths"))
    from preset_args import run_with_json_out

    return run_with_json_out(argv, DEFAULT, "time_scan_fused", _one, ROWS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
