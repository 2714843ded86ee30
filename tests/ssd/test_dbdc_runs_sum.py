"""The fold of the dB/dC kernel's head-run partials in one kernel (`runs_sum_kernel`, the
"kernel" path of MAMBA_TUNE_SSD_DBDC_SUM) against its definition and the torch path: in Helion
ref mode on the CPU at odd sizes and every float dtype, bitwise the runs added in order and
rounded once; the whole backward on it within the reference bound and deterministic; the switch;
where `plan` puts its key.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.kernel_keys import ModelShape, all_keys
from autotune_cli.presets import MODEL_PRESETS
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc as one

pytestmark = pytest.mark.usefixtures("nan_empty")

# (runs, batch, seqlen, ngroups, dstate)
PARTS = [
    pytest.param((2, 1, 100, 2, 16), id="R2-G2-N16"),
    pytest.param((3, 2, 37, 3, 24), id="R3-G3-N24-odd"),  # dstate not a power of two
    pytest.param((8, 2, 80, 1, 64), id="R8-G1-N64"),  # Zamba2's form: one group, 8 runs
]


def _in_order(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    acc = part[0].clone()
    for r in range(1, part.size(0)):
        acc = acc + part[r]
    return acc.to(dtype)


@pytest.mark.parametrize("ssd_ref_mode", ["min", "max"], indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape", PARTS)
def test_the_fold_adds_the_runs_in_order(shape, dtype, ssd_ref_mode, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    dB_part, dC_part = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen) * 100
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC_SUM", "kernel")
    dB, dC = one.sum_runs(dB_part, dC_part, dtype)
    assert dB.shape == dC.shape == shape[1:] and dB.dtype == dC.dtype == dtype
    assert torch.equal(dB, _in_order(dB_part, dtype))
    assert torch.equal(dC, _in_order(dC_part, dtype))
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC_SUM", "torch")
    tB, tC = one.sum_runs(dB_part, dC_part, dtype)
    # torch's sum may add in another order: within one rounding of the output's dtype.
    ulp = torch.finfo(dtype).eps
    for ours, theirs in ((dB, tB), (dC, tC)):
        assert ((ours.float() - theirs.float()).abs() <= ulp * theirs.float().abs() + 1e-6).all()


def test_one_run_takes_no_fold(monkeypatch):
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC_SUM", "kernel")
    part = torch.randn(1, 2, 16, 1, 16).to(torch.bfloat16)
    dB, dC = one.sum_runs(part, part, torch.bfloat16)
    assert dB.data_ptr() == part.data_ptr()  # the kernel wrote dB in x's dtype itself


def test_the_sum_switch(monkeypatch):
    monkeypatch.delenv("MAMBA_TUNE_SSD_DBDC_SUM", raising=False)
    assert one.sum_path() == "torch"  # until the kernel is timed on a GPU
    for path in ("torch", "kernel"):
        monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC_SUM", path)
        assert one.sum_path() == path
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC_SUM", "fused")
    with pytest.raises(ValueError, match="MAMBA_TUNE_SSD_DBDC_SUM='fused'; expected torch or kernel"):
        one.sum_path()


def test_its_key_is_planned_where_the_one_kernel_splits_the_heads():
    key = all_keys()["ssd_bwd_dbdc_runs_sum"]
    dbdc = all_keys()["ssd_chunk_state_scan_bwd_dbdc"]
    split = {}
    for name, m in MODEL_PRESETS.items():
        shape = ModelShape(batch=2, seqlen=8192, nheads=m.nheads, headdim=m.headdim, ngroups=m.ngroups,
                           dstate=m.dstate, chunk_size=m.chunk_size)
        dims = key.dims_for(shape)
        nchunks = -(-shape.seqlen // shape.chunk_size)
        runs = one.head_splits(shape.batch, nchunks, shape.ngroups, shape.nheads)
        assert (dims is not None) == (dbdc.dims_for(shape) is not None and runs > 1), name
        if dims is not None:
            assert dims == {"batch": 2, "seqlen": 8192, "ngroups": m.ngroups, "dstate": m.dstate, "runs": runs}
            split[name] = runs
    # The one-group presets (Mamba2, Zamba2: 8 runs of 10 heads; Falcon-H1: 4 of 6); not Nemotron's.
    assert split == {"mamba2-2.7b": 8, "zamba2-2.7b": 8, "falcon-h1-0.5b": 4}


# --- the whole backward on the fold ----------------------------------------------------------


def _grads(shape: tuple[int, ...], seed: int) -> dict[str, torch.Tensor]:
    from autotune_cli.kernel_keys import bwd_partials
    from autotune_cli.tuning.ssd.inputs import SSDInputs
    from mamba_tune.ssd import mamba_chunk_scan_combined

    b, L, H, P, G, N, Q = shape
    flags = {"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1, "has_seq_idx": 1, "has_initial_states": 1}
    i = SSDInputs.make({"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N,
                        "chunk_size": Q, **bwd_partials(P, N), **flags}, torch.bfloat16, "cpu", seed)
    names = ("x", "dt", "A", "B", "C", "D", "dt_bias", "initial_states")
    leaves = {k: getattr(i, k).detach().clone().requires_grad_() for k in names}
    kw = {**i.kwargs(), **{k: v for k, v in leaves.items() if k not in ("x", "dt", "A", "B", "C")}}
    out = mamba_chunk_scan_combined(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], i.chunk_size,
                                    **kw)
    dy = torch.randn(*out.shape, generator=torch.Generator().manual_seed(seed + 1)).to(out.dtype)
    return dict(zip(leaves, torch.autograd.grad(out, list(leaves.values()), dy), strict=True))


@pytest.mark.usefixtures("ssd_ref_mode")
def test_the_backward_on_the_fold_matches_the_torch_path(monkeypatch):
    """One group of 6 heads (Mamba2's form), seq_idx and initial states: the head runs' partials
    folded by the kernel give every gradient of the torch path (dB and dC within one bf16
    rounding, the rest bitwise: the fold is their last step), twice the same."""
    shape = (2, 80, 6, 24, 1, 32, 32)
    assert one.head_splits(2, 3, 1, 6) > 1
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC_SUM", "torch")
    want = _grads(shape, 4)
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC_SUM", "kernel")
    got, again = _grads(shape, 4), _grads(shape, 4)
    for name in want:
        assert torch.equal(got[name], again[name]), f"d{name} differs between two runs"
        assert not got[name].isnan().any(), name
        if name in ("B", "C"):
            scale = want[name].float().abs()
            assert ((got[name].float() - want[name].float()).abs() <= 2 ** -8 * scale + 1e-6).all(), name
        else:
            assert torch.equal(got[name], want[name]), f"d{name} changed with the sum path"
