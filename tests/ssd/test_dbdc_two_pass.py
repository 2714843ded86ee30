"""dB and dC in two passes (`mamba_tune.ssd.dbdc_two_pass`: each dCB tile computed once, through a
head-summed buffer) against the one kernel (`chunk_state_scan_bwd_dbdc`) and the fp32 reference,
in Helion ref mode on the CPU; its two kernels lowered to Triton at real sizes; the switch
(MAMBA_TUNE_SSD_DBDC) through the autograd drop-in; the shape rule mirrored where `plan` reads it.

Torch.empty returns NaN here (nan_empty): S is written only where j <= l, so a read of an
unwritten entry shows as NaN in dB or dC.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from autotune_cli.tuning import get
from mamba_tune import keys
from mamba_tune.keys import bwd_partials
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one
from mamba_tune.ssd import dbdc_two_pass as two
from mamba_tune.ssd import mamba_chunk_scan_combined

pytestmark = pytest.mark.usefixtures("nan_empty")

# (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size)
SHAPES = [
    pytest.param((2, 80, 4, 24, 2, 24, 32), id="L80-Q32-G2-P24-N24"),  # seqlen % chunk_size != 0
    pytest.param((1, 64, 1, 16, 1, 16, 16), id="H1-G1-L64-Q16"),  # one head, exact chunks
    pytest.param((2, 37, 6, 20, 3, 24, 16), id="L37-Q16-G3-P20-N24"),  # odd sizes, 3 groups
    pytest.param((2, 80, 6, 24, 1, 32, 32), id="G1-H6-N32"),  # one group of several heads (Mamba2's form)
]


def _inputs(shape: tuple[int, ...], z_on: bool, seq_on: bool, rows_on: bool, dtype: torch.dtype) -> tuple:
    b, L, H, P, G, N, Q = shape
    g = torch.Generator().manual_seed(0)
    nch = -(-L // Q)

    def randn(*s: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*s, generator=g).to(dt)

    dt = torch.rand(b, H, nch, Q, generator=g) * 0.5
    dA = torch.cumsum(-torch.rand(b, H, nch, Q, generator=g) * 0.3, dim=-1)
    seq = None
    if seq_on:  # three packed sequences, one starting inside a chunk
        seq = torch.zeros(b, L, dtype=torch.int32)
        seq[:, L // 3:] = 1
        seq[:, 2 * L // 3:] = 2
    rows = randn(3, keys.row_slots(P, N), b, H, nch * Q, dt=torch.float32) if rows_on else None
    cb = randn(b, nch, G, Q, Q, dt=torch.float32) if rows_on else None
    return (randn(b, L, H, P), randn(b, L, H, P) if z_on else None, randn(b, L, H, P), randn(b, L, G, N),
            randn(b, L, G, N), dt, dA, randn(b, nch, H, P, N), randn(b, nch, H, P, N), seq), rows, cb


@pytest.mark.parametrize("target,ssd_ref_mode", [pytest.param(None, "min", id="runs-rule-min"),
                                                  pytest.param(None, "max", id="runs-rule-max"),
                                                  pytest.param(10**6, "min", id="run-per-head-min")],
                         indirect=["ssd_ref_mode"])
@pytest.mark.parametrize("z_on,seq_on,rows_on", [(0, 0, 1), (1, 1, 0), (0, 1, 1)], ids=["rows", "z-seq_idx", "seq_idx-rows"])
@pytest.mark.parametrize("shape", SHAPES)
def test_two_passes_match_the_one_kernel_in_fp32(shape, z_on, seq_on, rows_on, target, ssd_ref_mode, monkeypatch):
    """The same sums in another order: fp32 outputs (dB, dC and the sums added to the dx
    kernel's rows) agree to rounding, at one run of heads per group and at one run per head."""
    if target is not None:
        monkeypatch.setattr(keys, "DBDC_TARGET_PROGRAMS", target)
    inputs, rows, cb = _inputs(shape, z_on, seq_on, rows_on, torch.float32)
    r1 = None if rows is None else rows.clone()
    r2 = None if rows is None else rows.clone()
    want = one._launch(*inputs, r1, cb)
    got = two._launch(*inputs, r2, cb)
    pairs = [("dB", got[0], want[0]), ("dC", got[1], want[1])] + ([("rows", r2, r1)] if rows is not None else [])
    for name, a, b in pairs:
        assert not a.isnan().any(), f"{name}: NaN (an unwritten entry of S read?)"
        scale = max(b.abs().max().item(), 1.0)
        assert (a - b).abs().max().item() <= 1e-5 * scale, f"{name}: {(a - b).abs().max().item():.3e} apart"


@pytest.mark.parametrize("ssd_ref_mode", ["min", "max"], indirect=True)
@pytest.mark.parametrize("flags", [pytest.param(0, id="flags-off"), pytest.param(1, id="flags-on")])
@pytest.mark.parametrize("shape", SHAPES)
def test_two_passes_within_the_stage_bound_in_bf16(shape, flags, ssd_ref_mode):
    """In bf16 on the tuning record's problem: dB, dC (and without z the rows' sums) within the
    bound every dB/dC config must meet (2x eager bf16's error against fp32 + atol)."""
    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    b, L, H, P, G, N, Q = shape
    dims = {"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, "chunk_size": Q,
            **bwd_partials(P, N), "has_z": flags, "has_seq_idx": flags}
    problem = tk.make_problem({k: v for k, v in dims.items() if k in tk.dims}, torch.bfloat16, torch.device("cpu"), 0)
    _dBp, _dCp, *inputs, rows, cb, _sides = problem.args
    dB, dC = two._launch(*inputs, rows, cb)
    outputs = {"dB": dB.float(), "dC": dC.float()}
    if rows is not None:
        r = rows.sum(1)
        outputs["ddt_chunk"], outputs["dout_y"] = r[0], r[2]
    ref, low = problem.reference(), problem.lowp_reference()
    assert outputs.keys() == ref.keys()
    for name in ref:
        scale = max(ref[name].abs().max().item(), 1.0)
        err = (outputs[name].float() - ref[name]).abs().max().item()
        bound = 2 * (low[name].float() - ref[name]).abs().max().item() + 2e-3 * scale
        assert err <= bound, f"{name}: max error {err:.3e} > {bound:.3e}"


def _grads(monkeypatch: pytest.MonkeyPatch, path: str, dtype: torch.dtype) -> list[torch.Tensor]:
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC", path)
    g = torch.Generator().manual_seed(1)
    b, L, H, P, G, N, Q = 2, 80, 6, 24, 1, 32, 32
    x = torch.randn(b, L, H, P, generator=g).to(dtype).requires_grad_()
    dt = (torch.rand(b, L, H, generator=g) * 0.1).to(dtype).requires_grad_()
    A = (-torch.rand(H, generator=g)).requires_grad_()
    B = torch.randn(b, L, G, N, generator=g).to(dtype).requires_grad_()
    C = torch.randn(b, L, G, N, generator=g).to(dtype).requires_grad_()
    D = torch.randn(H, generator=g).requires_grad_()
    out = mamba_chunk_scan_combined(x, dt, A, B, C, Q, D=D)
    out.backward(torch.randn(out.shape, generator=g).to(dtype))
    return [t.grad for t in (x, dt, A, B, C, D)]


@pytest.mark.usefixtures("ssd_ref_mode")
def test_the_switch_runs_the_two_passes_in_the_autograd_backward(monkeypatch):
    """MAMBA_TUNE_SSD_DBDC=two: the autograd drop-in's gradients equal the one kernel's to fp32
    rounding, and repeat bitwise; any other value is a clear error."""
    want = _grads(monkeypatch, "one", torch.float32)
    got = _grads(monkeypatch, "two", torch.float32)
    for name, a, b in zip("x dt A B C D".split(), got, want, strict=True):
        assert (a - b).abs().max().item() <= 1e-5 * max(b.abs().max().item(), 1.0), name
    again = _grads(monkeypatch, "two", torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True))
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC", "three")
    with pytest.raises(ValueError, match=r"MAMBA_TUNE_SSD_DBDC='three'; expected one or two"):
        _grads(monkeypatch, "three", torch.float32)


def test_the_rule_takes_the_two_passes_where_they_measured_faster():
    from mamba_tune.keys import two_pass_dbdc

    assert [two_pass_dbdc(n) for n in (64, 128, 256)] == [False, False, True]
    # Mamba2 / Zamba2 at batch 2, seqlen 8192, chunk 256 (32 chunks, one group of 80 heads): 8 runs
    # of 10 heads; Nemotron-3 Nano TP1 (64 chunks, 8 groups of 8 heads): one run.
    assert one.head_splits(2, 32, 1, 80) == 8
    assert one.head_splits(2, 64, 8, 64) == 1


def test_plan_lists_the_path_the_rule_runs():
    """At dstate 256 (Nemotron-H 47B) the keys are the two passes', elsewhere the one kernel's."""
    from mamba_tune.keys import ModelShape, all_keys

    by_name = all_keys()
    names = ("ssd_chunk_state_scan_bwd_dbdc", "ssd_chunk_state_scan_bwd_dcb", "ssd_bmm_bwd_dbdc")
    h47 = ModelShape(batch=2, seqlen=8192, nheads=256, headdim=64, ngroups=8, dstate=256, chunk_size=128)
    nano = ModelShape(batch=2, seqlen=8192, nheads=64, headdim=64, ngroups=8, dstate=128, chunk_size=128)
    assert [by_name[n].dims_for(h47) is None for n in names] == [True, False, False]
    assert by_name["ssd_bmm_bwd_dbdc"].dims_for(h47)["runs"] == one.head_splits(2, 64, 8, 256)
    assert [by_name[n].dims_for(nano) is None for n in names] == [False, True, True]


_LOWER = r"""
import json, sys, torch, helion
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one, dbdc_two_pass as two
from mamba_tune.ssd import chunk_scan_chunk_state_bwd_dx as dxk
out = []
for b, L, H, P, G, N, Q, flags in json.loads(sys.argv[1]):
    nch = -(-L // Q)
    e = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt)
    runs = one.head_splits(b, nch, G, H)
    S, dBs, dCs = e(runs, b, G, L, Q), e(runs, b, L, G, N, dt=torch.float32), e(runs, b, L, G, N, dt=torch.float32)
    rows = None if flags else e(3, dxk.row_slots(P, N), b, H, nch * Q, dt=torch.float32)
    cb = None if flags else e(b, nch, G, Q, Q, dt=torch.float32)
    a1 = (S, dBs, dCs, e(b, L, H, P), e(b, L, H, P) if flags else None, e(b, L, H, P), e(b, L, G, N),
          e(b, H, nch, Q, dt=torch.float32), e(b, H, nch, Q, dt=torch.float32), e(b, nch, H, P, N),
          e(b, nch, H, P, N), torch.zeros(b, L, dtype=torch.int32) if flags else None, rows, cb)
    a2 = (e(b, L, G, N), e(b, L, G, N), S, dBs, dCs, e(b, L, G, N), e(b, L, G, N))
    for rk, args in ((two.SSD_DCB, a1), (two.SSD_DBDC_FROM_DCB, a2)):
        code = rk.kernel.bind(args).to_triton_code(helion.Config(**rk.default_config(rk.dims_from_args(args))))
        compile(code, rk.name, "exec")
        out.append(rk.name)
print(json.dumps(out))
"""
LOWER_SHAPES = {  # (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size, z and seq_idx)
    "mamba2-2.7b": (2, 8192, 80, 64, 1, 128, 256, 0),
    "nemotron3-nano-z-seq_idx": (2, 8192, 64, 64, 8, 128, 128, 1),
    "nemotron-h-47b": (2, 8192, 256, 64, 8, 256, 128, 0),
    "odd": (2, 37, 6, 20, 3, 24, 16, 1),
}


def test_two_pass_kernels_lower_at_their_defaults():
    """Helion's compiler front end (no GPU) accepts both kernels at their default configs at
    real sizes and odd ones, and Python accepts the generated source (in one process without
    ref mode)."""
    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _LOWER, json.dumps(list(LOWER_SHAPES.values()))], env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    names = json.loads(res.stdout.strip().splitlines()[-1])
    assert names == ["ssd_chunk_state_scan_bwd_dcb", "ssd_bmm_bwd_dbdc"] * len(LOWER_SHAPES)
