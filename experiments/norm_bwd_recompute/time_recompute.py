"""Time the one-pass gated norm backward (recompute.py) against the layer's forward-then-backward (GPU).

    python experiments/norm_bwd_recompute/time_recompute.py [PRESET[@TP][/BxL] ...] [--json-out FILE]

Default: nemotron-3-nano-30b (TP1, batch 2, seqlen 8192). `@TP`: one rank's heads and groups;
`/BxL`: batch B, seqlen L (e.g. `zamba2-2.7b/4x2048`, `nemotron-3-nano-30b@2`). bf16, in one
process, `do_bench` medians (L2 flushed) in ms:
1. the norm stage alone at the layer's call (z a column slice of zxbcdt, dz into a slice of its
   gradient): `gated._fwd` + `gated._bwd` on their bundle entries, against the one pass on its
   default config and on the `gated_norm_bwd` entry's config (`recompute.borrowed`: same block
   sizes, warps, stages; Helion's defaults for the per-load/store lists), with whether its outputs
   equal the current path's bitwise (and their largest relative difference);
2. mamba-ssm's `Mamba2` training step on its default fused path (`use_mem_eff_path=True`):
   unpatched (mamba-ssm), patched (mamba-tune), and patched with `recompute.installed()` (on the
   borrowed config), with peak memory, the ratios, and whether the gradients equal the patched
   step's bitwise; then the patched step again (drift check).
Prints each preset's table as it finishes ("vs ref": the named reference row's ms over this row's, > 1: faster; "peak MiB":
one step's peak above what was allocated before it); `--json-out` writes its rows. Exits 2 after one line for a bad argument or
without a CUDA GPU; 1 when a preset failed (the others still run).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

PROG = "time_recompute"
DEFAULT = ["nemotron-3-nano-30b"]


def parse(argv: list[str]) -> tuple[list[tuple[str, Any, int, int, int]], Path | None] | None:
    """[(label, dims, tp, batch, seqlen)] and the JSON path, or None after a one-line error."""
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("presets", nargs="*", default=DEFAULT, help="PRESET[@TP][/BxL]")
    p.add_argument("--json-out", type=Path, default=None, help="write the rows as JSON here")
    a = p.parse_args(argv)
    from preset_args import parse_presets

    runs = []
    for arg in a.presets:
        name, _, bl = arg.partition("/")
        m = re.fullmatch(r"(\d+)x(\d+)", bl) if bl else None
        if bl and (m is None or int(m.group(1)) < 1 or int(m.group(2)) < 1):
            print(f"{PROG}: {arg!r}: the part after '/' must be BxL (batch x seqlen, e.g. 4x2048)", file=sys.stderr)
            return None
        wanted = parse_presets([name], DEFAULT, PROG)
        if wanted is None:
            return None
        (_, dims, tp), = wanted
        runs.append((arg, dims, tp, int(m.group(1)) if m else 2, int(m.group(2)) if m else 8192))
    return runs, a.json_out


def main(argv: list[str]) -> int:
    parsed = parse(argv)
    if parsed is None:
        return 2
    runs, json_out = parsed
    import torch

    if not torch.cuda.is_available():
        print(f"{PROG}: needs a CUDA GPU", file=sys.stderr)
        return 2
    from autotune_cli.benchmarks.common import machine_line

    machine = machine_line()
    print(machine, flush=True)
    rows: list[dict[str, Any]] = []
    failed = 0
    for label, dims, tp, batch, seqlen in runs:
        try:
            new = _one(label, dims, tp, batch, seqlen)
            _print(new)  # each preset's rows as it finishes: a run cut short keeps what it measured
            rows += new
            _write(json_out, machine, rows)
        except Exception as e:  # say which preset and why, go on with the next
            failed += 1
            print(f"{PROG}: {label}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                  file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    return 1 if failed else 0


def _write(json_out: Path | None, machine: str, rows: list[dict[str, Any]]) -> None:
    if json_out is None:
        return
    import datetime
    import json

    from mamba_tune.bundle import write_text_atomic

    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_text_atomic(json_out, json.dumps({"machine": machine, "timestamp": stamp, "rows": rows}, indent=2))
    print(f"wrote {json_out}", file=sys.stderr)


def _print(rows: list[dict[str, Any]]) -> None:
    head = f"{'preset':<28} {'row':<34} {'ms':>8} {'vs ref':>7} {'peak MiB':>9} {'bitwise':>7} {'rel diff':>8}  ref / config"
    print(head)
    for r in rows:
        ratio = "" if r.get("ratio") is None else f"{r['ratio']:.3f}"
        peak = "" if r.get("peak_mib") is None else f"{r['peak_mib']:.0f}"
        bit = "" if r.get("bitwise") is None else str(r["bitwise"])
        diff = "" if r.get("max_rel_diff") is None else f"{r['max_rel_diff']:.1e}"
        print(f"{r['preset']:<28} {r['row']:<34} {r['ms']:>8.4f} {ratio:>7} {peak:>9} {bit:>7} {diff:>8}  "
              f"{r.get('ref', '')} {r.get('config', '')}".rstrip())


def _one(label: str, d: Any, tp: int, batch: int, seqlen: int) -> list[dict[str, Any]]:
    import recompute

    from autotune_cli.benchmarks.layer import layer_shape

    s = layer_shape(d, tp, batch, seqlen)
    base = {"preset": label, "shape": s.text(), "dtype": "bf16"}
    rows, config, config_note = _norm_stage(label, base, s)
    with recompute.use_config(config):
        return rows + _steps(base, s, config_note)


def _norm_stage(label: str, base: dict[str, Any], s: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None, str]:
    """The norm stage's rows, the borrowed config (None: none fits) and where it came from."""
    import recompute
    import torch

    from autotune_cli.timing import gpu_median_ms
    from mamba_tune import runtime
    from mamba_tune.norm import gated

    dev, dtype, eps = "cuda", torch.bfloat16, 1e-5
    rows_n, dim, gs = s.batch * s.seqlen, s.dim, s.dim // s.ngroups
    gen = torch.Generator(device=dev).manual_seed(0)
    zxbcdt = torch.randn(rows_n, s.d_in_proj, generator=gen, device=dev).to(dtype)
    z = zxbcdt[:, :dim]  # the layer's z: a column slice of in_proj's output
    y = torch.randn(rows_n, dim, generator=gen, device=dev).to(dtype)
    dy = torch.randn(rows_n, dim, generator=gen, device=dev).to(dtype)
    w = (torch.randn(dim, generator=gen, device=dev) * 0.1 + 1).to(dtype)  # Mamba2's norm weight: the model's dtype
    dz_cur, dz_one = torch.empty_like(zxbcdt), torch.empty_like(zxbcdt)

    def current() -> Any:
        out, _, rstd = gated._fwd(y, z, w, None, eps, gs, False, True)
        return (*gated._bwd(dy, y, z, w, None, None, rstd, gs, False, True, dz2=dz_cur[:, :dim]), out)

    def one_pass() -> Any:
        return recompute.norm_bwd_recompute(dy, y, z, w, None, eps, gs, False, True, dz2=dz_one[:, :dim])

    bwd_args = (dy.view(rows_n, s.ngroups, gs), y.view(rows_n, s.ngroups, gs), z.view(rows_n, s.ngroups, gs),
                w.view(s.ngroups, gs), None, None, None, dz_cur[:, :dim].view(rows_n, s.ngroups, gs), False, True)
    res = runtime.resolve(gated.GATED_NORM_BWD, bwd_args)
    config = None if res.config is None else recompute.borrowed(res.config)
    if config is not None:  # the borrowed config must fit this kernel's space (the runtime's check), else the default
        from mamba_tune.config_schema import checked_config

        try:
            bound = recompute.gated_norm_bwd_recompute_kernel.bind(
                (dy.view(rows_n, s.ngroups, gs), *bwd_args[1:5], bwd_args[7], eps, False, True))
            checked_config(config, bound.config_spec)
        except Exception as e:
            print(f"{PROG}: {label}: gated_norm_bwd's config does not fit the one pass ({type(e).__name__}: "
                  f"{str(e).splitlines()[0][:200] if str(e) else ''}); its default runs", file=sys.stderr)
            config = None
    borrowed_note = f"borrowed from gated_norm_bwd {res.source}" if config is not None else "default"

    out: list[dict[str, Any]] = []
    cur_ms = gpu_median_ms(current, 200)
    want = current()
    out.append({**base, "row": "norm fwd + bwd (current)", "ms": cur_ms, "config": "bundle entries"})
    with recompute.use_config(None):
        ms = gpu_median_ms(one_pass, 200)
        out.append({**base, "row": "norm one pass (default config)", "ms": ms, "ratio": cur_ms / ms,
                    "ref": "current", **_compare(one_pass(), want, dz_one, dz_cur, dim),
                    "config": "default"})
    if config is not None:
        with recompute.use_config(config):
            ms = gpu_median_ms(one_pass, 200)
            out.append({**base, "row": "norm one pass (borrowed config)", "ms": ms, "ratio": cur_ms / ms,
                        "ref": "current", **_compare(one_pass(), want, dz_one, dz_cur, dim),
                        "config": borrowed_note})
    return out, config, borrowed_note


def _compare(got: Any, want: Any, dz_got: Any, dz_want: Any, dim: int) -> dict[str, Any]:
    """The one pass's (dx, dz, dw, db, out) against the current path's: bitwise, and the largest
    difference relative to each tensor's largest magnitude."""
    dx, _dz, dw, _db, out = got
    wdx, _wdz, wdw, _wdb, wout = want
    return _diff([dx, dz_got[:, :dim], dw, out], [wdx, dz_want[:, :dim], wdw, wout])


def _diff(got: Any, want: Any) -> dict[str, Any]:
    import torch

    rel = max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()
              for a, b in zip(got, want, strict=True))
    return {"bitwise": all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), "max_rel_diff": rel}


def _steps(base: dict[str, Any], s: Any, config_note: str) -> list[dict[str, Any]]:
    """mamba-ssm's Mamba2 training step (fused path): unpatched, patched, patched with the one pass."""
    import copy

    import recompute
    import torch

    from autotune_cli.benchmarks.module import (
        build_module,
        fused_baseline_missing,
        module_step,
        side,
    )
    from autotune_cli.benchmarks.ssd import peak_mib
    from autotune_cli.timing import gpu_median_ms

    theirs = build_module(s, torch.bfloat16, "cuda", True)
    ours = copy.deepcopy(theirs)
    gen = torch.Generator(device="cuda").manual_seed(1)
    u = torch.randn(s.batch, s.seqlen, s.d_model, generator=gen, device="cuda").to(torch.bfloat16)
    dout = torch.randn(s.batch, s.seqlen, s.d_model, generator=gen, device="cuda").to(torch.bfloat16)
    step_ours, step_theirs = module_step(ours, u, dout, True), module_step(theirs, u, dout, True)
    rows: list[dict[str, Any]] = []
    note = fused_baseline_missing()
    base_ms = None
    if note is None:
        with side(ours=False):
            base_ms = gpu_median_ms(step_theirs, 500)
            rows.append({**base, "row": "Mamba2 step: mamba-ssm", "ms": base_ms, "peak_mib": peak_mib(step_theirs)})
    else:
        print(f"{PROG}: {note}: no mamba-ssm row", file=sys.stderr)
    with side(ours=True):
        ours_ms = gpu_median_ms(step_ours, 500)
        want = step_ours()
        rows.append({**base, "row": "Mamba2 step: mamba-tune", "ms": ours_ms, "peak_mib": peak_mib(step_ours),
                     "ratio": None if base_ms is None else base_ms / ours_ms, "ref": "mamba-ssm"})
        with recompute.installed():
            ms = gpu_median_ms(step_ours, 500)
            got = step_ours()
            peak = peak_mib(step_ours)
        rows.append({**base, "row": "Mamba2 step: mamba-tune + one pass", "ms": ms, "peak_mib": peak,
                     "ratio": None if base_ms is None else base_ms / ms, "ref": "mamba-ssm", **_diff(got, want),
                     "config": config_note})
        rows.append({**base, "row": "  one pass vs mamba-tune", "ms": ms, "ratio": ours_ms / ms, "ref": "mamba-tune"})
        again = gpu_median_ms(step_ours, 500)
        rows.append({**base, "row": "Mamba2 step: mamba-tune (again)", "ms": again,
                     "ratio": None if base_ms is None else base_ms / again, "ref": "mamba-ssm"})
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "ssd_bwd_paths"))
    sys.exit(main(sys.argv[1:]))
