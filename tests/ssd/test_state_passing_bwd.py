"""The two-kernel state-passing backward (`state_passing_bwd`) against the fused walk
(`chunk_state_passing_bwd`), ref mode on the CPU: same outputs up to fp32 summation order; and
the rule that picks one per shape."""

from __future__ import annotations

import pytest
import torch

from mamba_tune.ssd import chunk_state_passing_bwd as fused
from mamba_tune.ssd import state_passing_bwd as split


def _inputs(b: int, L: int, H: int, P: int, G: int, N: int, Q: int, z: bool, dfinal: bool, seq: bool):
    g = torch.Generator().manual_seed(0)
    nc = -(-L // Q)
    dy = torch.randn(b, L, H, P, generator=g).to(torch.bfloat16)
    zt = torch.randn(b, L, H, P, generator=g).to(torch.bfloat16) if z else None
    C = torch.randn(b, L, G, N, generator=g).to(torch.bfloat16)
    dA = (-torch.rand(b, H, nc, Q, generator=g) * 0.2).cumsum(-1)
    prev = torch.randn(b, nc, H, P, N, generator=g).to(torch.bfloat16)
    df = torch.randn(b, H, P, N, generator=g) if dfinal else None
    seq_idx = None
    if seq:  # three sequences per row, boundaries inside chunks and on one
        cuts = torch.tensor([Q // 2 + 1, 2 * Q])
        seq_idx = (torch.arange(L)[:, None] >= cuts[None, :]).sum(-1).to(torch.int32).expand(b, L).contiguous()
    return dy, zt, C, dA, prev, df, seq_idx


@pytest.mark.parametrize("shape", [(1, 100, 4, 16, 2, 16, 32), (2, 64, 3, 24, 1, 8, 16), (1, 96, 2, 32, 1, 32, 32)],
                         ids=["L100-G2", "odd-H3-N8", "H2-P32"])
@pytest.mark.parametrize("opts", [(False, False, False), (True, True, True), (False, True, True), (True, False, False)],
                         ids=["plain", "z-dfinal-seq", "dfinal-seq", "z"])
def test_split_matches_the_fused_walk(shape, opts):
    args = _inputs(*shape, *opts)
    want = fused._launch(*args)
    got = split._launch(*args)
    names = ("dstates", "ddA_last", "dinitial_states")
    for name, w, g in zip(names, want, got, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        w, g = w.float(), g.float()
        if name == "ddA_last":  # partials per state block: blocks differ, their sums must not
            w, g = w.sum(0), g.sum(0)
        tol = 2e-2 * max(1.0, float(w.abs().max()))
        assert float((g - w).abs().max()) <= tol, (name, float((g - w).abs().max()), tol)


def test_the_rule_picks_the_path_measured_faster():
    from mamba_tune.keys import split_state_passing_bwd

    # The measured presets (batch 2): Falcon-H1, Mamba2 and Zamba2 split; Nano TP2 and TP1, 8B, 47B one walk.
    assert [split_state_passing_bwd(2, h, q) for h, q in ((24, 128), (80, 256))] == [True] * 2
    assert [split_state_passing_bwd(2, h, q) for h, q in ((32, 128), (64, 128), (128, 128), (256, 128))] == [
        False] * 4


@pytest.mark.parametrize("path", ["fused", "split", ""])
def test_the_backward_runs_the_path_asked_for(ssd_ref_mode, tmp_path, monkeypatch, path):
    import json

    import mamba_tune
    from autotune_cli.tuning.ssd.inputs import SSDInputs

    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", path)
    dims = {"batch": 1, "seqlen": 40, "nheads": 2, "headdim": 16, "ngroups": 1, "dstate": 16, "chunk_size": 16}
    i = SSDInputs.make(dims, torch.float32, "cpu", seed=0)
    x = i.x.clone().requires_grad_()
    with mamba_tune.record_calls(tmp_path / "calls.json"):
        mamba_tune.mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size).sum().backward()
    ran = {c["kernel"] for c in json.loads((tmp_path / "calls.json").read_text())["calls"].values()}
    split_ran = {"ssd_state_passing_bwd", "ssd_chunk_state"} <= ran and "ssd_chunk_state_passing_bwd" not in ran
    assert split_ran == (path != "fused"), ran  # 2 heads: the rule picks split


def test_a_bad_path_value_is_refused(ssd_ref_mode, monkeypatch):
    from autotune_cli.tuning.ssd.inputs import SSDInputs
    from mamba_tune.ssd import combined

    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", "walk")
    i = SSDInputs.make({"batch": 1, "seqlen": 32, "nheads": 2, "headdim": 16, "ngroups": 1, "dstate": 16,
                        "chunk_size": 16}, torch.float32, "cpu", seed=0)
    with pytest.raises(ValueError, match="MAMBA_TUNE_SSD_SP_BWD='walk'"):
        combined.ssd_backward(i.x, None, i.x, i.dt, i.A, i.B, i.C, i.chunk_size)
