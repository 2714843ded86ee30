"""The mamba-ssm switch on a CUDA GPU, against mamba-ssm itself (`pytest -m gpu tests/patch/test_patch_gpu.py`).

mamba-ssm's `Mamba2` (use_mem_eff_path=False) at Nemotron-3 Nano's dims, patched against
unpatched; the gated norm with the module's row-strided z; the varlen states against
mamba-ssm's `chunk_state_varlen`. Bound: err(ours) <= 2 * err(mamba-ssm) + atol, both
against an fp32 evaluation.
"""

from __future__ import annotations

import copy

import mamba_ssm_cpu
import pytest
import torch

import mamba_tune
from autotune_cli.reference import gated_norm_ref, ssd_chunked_ref
from autotune_cli.tuning.ssd.inputs import SSDInputs

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not mamba_ssm_cpu.installed(), reason="mamba-ssm is not installed"),
]


def _assert_bounded(name: str, ours: torch.Tensor, ref: torch.Tensor, theirs: torch.Tensor, atol: float) -> None:
    assert not ours.isnan().any(), f"{name}: NaN"
    err = (ours.float() - ref.float()).abs().max().item()
    bound = 2 * (theirs.float() - ref.float()).abs().max().item() + atol
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * mamba-ssm's error + atol = {bound:.3e}"


@pytest.fixture(autouse=True)
def _unpatched():
    mamba_ssm_cpu.load()
    mamba_tune.unpatch_mamba_ssm()
    yield
    mamba_tune.unpatch_mamba_ssm()


def test_patched_mamba2_matches_mamba_ssm_at_nano_dims():
    from mamba_ssm.modules.mamba2 import Mamba2

    torch.manual_seed(0)
    # Nemotron-3 Nano's mixer (TP1): d_ssm 4096 = 64 heads x 64, 8 groups, dstate 128, chunk 128.
    dims = {"d_model": 2048, "d_state": 128, "headdim": 64, "ngroups": 8, "chunk_size": 128,
            "use_mem_eff_path": False, "device": "cuda"}
    theirs = Mamba2(**dims, dtype=torch.bfloat16)
    with mamba_tune.patched_mamba_ssm():
        ours = Mamba2(**dims, dtype=torch.bfloat16)
    assert type(ours.norm) is mamba_tune.RMSNormGated
    ours.load_state_dict(theirs.state_dict())
    ref = copy.deepcopy(theirs).float()
    u = torch.randn(2, 4096, 2048, device="cuda")
    with torch.no_grad():
        out_ref = ref(u)
        out_theirs = theirs(u.bfloat16())
        with mamba_tune.patched_mamba_ssm():
            out_ours = ours(u.bfloat16())
    _assert_bounded("Mamba2 forward", out_ours, out_ref, out_theirs, 1e-2)


@pytest.mark.parametrize("weight_dtype", [torch.float32, torch.bfloat16], ids=["w32", "wbf16"])
def test_norm_with_the_modules_strided_z_matches_mamba_ssm(weight_dtype):
    from mamba_ssm.ops.triton.layernorm_gated import rmsnorm_fn as theirs

    d, ngroups, dstate, nheads = 4096, 8, 128, 64
    proj = torch.randn(2, 8192, 2 * d + 2 * ngroups * dstate + nheads, device="cuda", dtype=torch.bfloat16)
    z = proj[..., :d]
    x = torch.randn(2, 8192, d, device="cuda", dtype=torch.bfloat16)
    w = (1 + 0.1 * torch.randn(d, device="cuda")).to(weight_dtype)
    kw = {"eps": 1e-5, "group_size": d // ngroups, "norm_before_gate": False}
    ref = gated_norm_ref(x.float(), w.float(), None, z.float(), 1e-5, d // ngroups, False, True)
    _assert_bounded("norm", mamba_tune.rmsnorm_fn(x, w, None, z=z, **kw), ref, theirs(x, w, None, z=z, **kw), 1e-2)


def test_varlen_states_match_mamba_ssm():
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined as theirs

    lengths = [700, 1, 1500, 129, 1766]  # 4096 positions, boundaries inside and on chunks
    dims = {"batch": 1, "seqlen": sum(lengths), "nheads": 64, "headdim": 64, "ngroups": 8, "dstate": 128,
            "chunk_size": 128, "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    i = SSDInputs.make(dims, torch.bfloat16, "cuda", 0)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    seq_idx = torch.repeat_interleave(torch.arange(len(lengths), device="cuda", dtype=torch.int32),
                                      torch.tensor(lengths, device="cuda"))[None]
    kw = {"D": i.D, "dt_bias": i.dt_bias, "seq_idx": seq_idx, "cu_seqlens": cu, "dt_softplus": True,
          "return_varlen_states": True}
    _, ours = mamba_tune.mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, 128, **kw)
    _, their_states = theirs(i.x, i.dt, i.A, i.B, i.C, 128, **kw)
    u = i.upcast()
    ref = torch.stack([
        ssd_chunked_ref(u.x[:, s:e], u.dt[:, s:e], u.A, u.B[:, s:e], u.C[:, s:e], 128, dt_bias=u.dt_bias,
                        dt_softplus=True)[1][0]
        for s, e in zip(cu[:-1].tolist(), cu[1:].tolist())])
    assert ours.shape == their_states.shape and ours.dtype == their_states.dtype
    _assert_bounded("varlen states", ours, ref, their_states, 1e-2)
