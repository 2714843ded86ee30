"""The dB/dC kernel with dC and dB in one program each (`sides` 2) against one program for both
(1): the same dots in the same order, so bitwise the same dB, dC and dx-kernel sums, in Helion
ref mode on the CPU at odd sizes, with z, seq_idx, head runs; lowered to Triton at a real size;
the switch (MAMBA_TUNE_SSD_DBDC_SIDES) checked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from mamba_tune.ssd import chunk_scan_chunk_state_bwd_dx as dx_kernel
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one

pytestmark = pytest.mark.usefixtures("nan_empty")

# (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size)
SHAPES = [
    pytest.param((2, 80, 4, 24, 2, 24, 32), id="L80-Q32-G2-P24-N24"),  # seqlen % chunk_size != 0
    pytest.param((2, 37, 6, 20, 3, 24, 16), id="L37-Q16-G3-P20-N24"),  # odd sizes, 3 groups
    pytest.param((2, 80, 6, 24, 1, 32, 32), id="G1-H6-N32"),  # one group of several heads (Mamba2's form)
]


def _inputs(shape: tuple[int, ...], z_on: bool, seq_on: bool, rows_on: bool) -> tuple:
    b, L, H, P, G, N, Q = shape
    g = torch.Generator().manual_seed(1)
    nch = -(-L // Q)

    def randn(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=g)

    dt = torch.rand(b, H, nch, Q, generator=g) * 0.5
    dA = torch.cumsum(-torch.rand(b, H, nch, Q, generator=g) * 0.3, dim=-1)
    seq = None
    if seq_on:  # two packed sequences, the second starting inside a chunk
        seq = torch.zeros(b, L, dtype=torch.int32)
        seq[:, L // 2 + 3:] = 1
    rows = randn(3, dx_kernel.row_slots(P, N), b, H, nch * Q) if rows_on else None
    cb = randn(b, nch, G, Q, Q) if rows_on else None
    return (randn(b, L, H, P), randn(b, L, H, P) if z_on else None, randn(b, L, H, P), randn(b, L, G, N),
            randn(b, L, G, N), dt, dA, randn(b, nch, H, P, N), randn(b, nch, H, P, N), seq), rows, cb


@pytest.mark.parametrize("target,ssd_ref_mode", [pytest.param(None, "min", id="runs-rule-min"),
                                                  pytest.param(10**6, "max", id="run-per-head-max")],
                         indirect=["ssd_ref_mode"])
@pytest.mark.parametrize("z_on,seq_on,rows_on", [(0, 0, 1), (1, 1, 0), (0, 1, 1)], ids=["rows", "z-seq_idx", "seq_idx-rows"])
@pytest.mark.parametrize("shape", SHAPES)
def test_two_sides_equal_one_bitwise(shape, z_on, seq_on, rows_on, target, ssd_ref_mode, monkeypatch):
    if target is not None:
        monkeypatch.setattr(one, "TARGET_PROGRAMS", target)
    inputs, rows, cb = _inputs(shape, z_on, seq_on, rows_on)
    got = {}
    for n in ("1", "2"):
        monkeypatch.setenv(one.SIDES_VAR, n)
        r = None if rows is None else rows.clone()
        dB, dC = one._launch(*inputs, r, cb)
        got[n] = {"dB": dB, "dC": dC, **({"rows": r} if r is not None else {})}
    for name, want in got["1"].items():
        assert not want.isnan().any(), f"{name}: NaN (an unwritten entry read?)"
        assert torch.equal(got["2"][name], want), f"{name}: {(got['2'][name] - want).abs().max().item():.3e} apart"


def test_the_rule_and_the_switch(monkeypatch):
    monkeypatch.delenv(one.SIDES_VAR, raising=False)
    # Two sides at every shape measured: Mamba2 / Zamba2 (8 head runs), Falcon-H1 (4), Nano TP1 (1).
    assert one.sides() == 2
    monkeypatch.setenv(one.SIDES_VAR, "1")
    assert one.sides() == 1
    monkeypatch.setenv(one.SIDES_VAR, "2")
    assert one.sides() == 2
    monkeypatch.setenv(one.SIDES_VAR, "two")
    with pytest.raises(ValueError, match="MAMBA_TUNE_SSD_DBDC_SIDES='two': expected '1', '2'"):
        one.sides()


def test_the_head_splits_switch(monkeypatch):
    # Mamba2 / Zamba2 at batch 2, seqlen 8192, chunk 256: 32 chunks, one group of 80 heads.
    monkeypatch.delenv(one.SPLITS_VAR, raising=False)
    assert one.head_splits(2, 32, 1, 80) == 8
    for asked, runs in (("4", 4), ("1", 1), ("3", 3), ("16", 16), ("500", 80)):  # 3: 27 + 27 + 26 heads
        monkeypatch.setenv(one.SPLITS_VAR, asked)
        assert one.head_splits(2, 32, 1, 80) == runs, asked
    monkeypatch.setenv(one.SPLITS_VAR, "6")  # 14 heads a run: 6 runs
    assert one.head_splits(2, 32, 1, 80) == 6
    monkeypatch.setenv(one.SPLITS_VAR, "7")  # 12 heads a run: 7 runs
    assert one.head_splits(2, 32, 1, 80) == 7
    for bad in ("0", "-2", "four", "2.5"):
        monkeypatch.setenv(one.SPLITS_VAR, bad)
        with pytest.raises(ValueError, match=f"MAMBA_TUNE_SSD_DBDC_SPLITS={bad!r}: expected a positive integer"):
            one.head_splits(2, 32, 1, 80)


_LOWER = r"""
import json, torch, helion
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one
from mamba_tune.ssd import chunk_scan_chunk_state_bwd_dx as dxk
b, L, H, P, G, N, Q = 2, 8192, 80, 64, 1, 128, 256
nch = L // Q
e = lambda *s, dt=torch.bfloat16: torch.empty(*s, dtype=dt)
splits = one.head_splits(b, nch, G, H)
out = {}
for n in (1, 2):
    part = e(splits, b, L, G, N, dt=torch.float32)
    args = (part, part.clone(), e(b, L, H, P), None, e(b, L, H, P), e(b, L, G, N), e(b, L, G, N),
            e(b, H, nch, Q, dt=torch.float32), e(b, H, nch, Q, dt=torch.float32), e(b, nch, H, P, N),
            e(b, nch, H, P, N), None, e(3, dxk.row_slots(P, N), b, H, nch * Q, dt=torch.float32),
            e(b, nch, G, Q, Q, dt=torch.float32), n)
    rk = one.SSD_CHUNK_STATE_SCAN_BWD_DBDC
    code = rk.kernel.bind(args).to_triton_code(helion.Config(**rk.default_config(rk.dims_from_args(args))))
    compile(code, rk.name, "exec")
    out[n] = {"splits": splits, "code": code}
print(json.dumps(out))
"""


def test_both_forms_lower_at_mamba2():
    """Compiled mode's front end (no GPU, a process without ref mode) at Mamba2-2.7B's size (one
    group of 80 heads, chunk 256), the default config: with two sides the dB branch tests the
    side index and the grid doubles."""
    env = {k: v for k, v in os.environ.items() if k != "HELION_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _LOWER], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for n in ("1", "2"):
        code = out[n]["code"].replace("\n", "").replace(" ", "")
        programs = out[n]["splits"] * (8192 // 64) * 2 * int(n)  # default blocks: 64 rows, all 128 of dstate
        assert f"(_helion_chunk_state_scan_bwd_dbdc_kernel,({programs},)" in code, n
        assert ("==1" in code) == (n == "2"), n
