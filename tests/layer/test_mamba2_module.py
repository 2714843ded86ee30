"""mamba-ssm's own `Mamba2` on its default fused path (`use_mem_eff_path=True`), patched, forward
and backward, against the same module's unfused path on the fp32 references.

Patched, `Mamba2.forward` calls `mamba_tune.mamba_split_conv1d_scan_combined` (Helion ref
mode). Its unpatched fused path runs mamba-ssm's Triton kernels and cannot run on a CPU, so
the reference is the same weights through mamba-ssm's unfused path (`use_mem_eff_path=False`:
torch's nn.Conv1d, SiLU, the split, SwiGLU and out_proj in mamba-ssm's own code) with its
`mamba_chunk_scan_combined` and `rmsnorm_fn` replaced by the fp32 references: an independent
composition of the same layer. The GPU test (test_gpu.py) compares with the fused path itself.

Bound: err(patched) <= 2 * err(reference in the module's dtype) + atol * scale, against the
reference in fp32 on the same (rounded) weights and input, for the output, the input's
gradient and every parameter's gradient.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import mamba_ssm_cpu
import pytest
import torch

import mamba_tune
from autotune_cli.reference import gated_norm_ref, ssd_chunked_ref

pytestmark = [pytest.mark.usefixtures("layer_ref_mode"),
              pytest.mark.skipif(not mamba_ssm_cpu.installed(),
                                 reason="mamba-ssm is not installed (.ci/run installs it)")]


@pytest.fixture
def modules() -> Iterator[dict[str, Any]]:
    mamba_ssm_cpu.load()
    from mamba_ssm.modules import mamba2, mamba2_simple
    from mamba_ssm.ops.triton import layernorm_gated

    mamba_tune.unpatch_mamba_ssm()
    yield {"mamba2": mamba2, "mamba2_simple": mamba2_simple, "layernorm_gated": layernorm_gated}
    mamba_tune.unpatch_mamba_ssm()


def _reference_fns(upcast: bool) -> tuple[Any, Any]:
    def ssd(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
            cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")), return_final_states=False,
            return_varlen_states=False):
        assert not return_final_states and not return_varlen_states and cu_seqlens is None
        out, _ = ssd_chunked_ref(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                                 initial_states=initial_states, seq_idx=seq_idx, dt_softplus=dt_softplus,
                                 dt_limit=dt_limit, upcast=upcast)
        return out

    def rmsnorm(x, weight, bias, z=None, eps=1e-6, group_size=None, norm_before_gate=True):
        return gated_norm_ref(x, weight, bias, z, eps, group_size, norm_before_gate, True, upcast=upcast)

    return ssd, rmsnorm


def _grads(module: torch.nn.Module, u: torch.Tensor, dout: torch.Tensor) -> dict[str, torch.Tensor]:
    """The output, d input and every parameter's gradient for output gradient dout."""
    u = u.detach().clone().requires_grad_()
    module.zero_grad(set_to_none=True)
    out = module(u)
    out.backward(dout.to(out.dtype))
    result = {"out": out.detach(), "d_input": u.grad}
    for name, p in module.named_parameters():
        assert p.grad is not None, f"{name}: no gradient"
        result[name] = p.grad
    return result


def _reference(modules, monkeypatch, module, u, dout, upcast: bool, where: str = "mamba2"
               ) -> dict[str, torch.Tensor]:
    ssd, rmsnorm = _reference_fns(upcast)
    module.use_mem_eff_path = False
    with monkeypatch.context() as m:
        m.setattr(modules[where], "mamba_chunk_scan_combined", ssd)
        m.setattr(modules["layernorm_gated"], "rmsnorm_fn", rmsnorm)  # what mamba-ssm's RMSNorm calls
        return _grads(module, u, dout)


# Module options: the norm gate after the norm (Mamba2's default) in 2 groups, before it, z into
# the SSD (no norm) with D per channel and a dt_limit, and a SwiGLU part (d_ssm < d_inner).
OPTIONS = [
    pytest.param({"ngroups": 2}, id="rmsnorm-G2"),
    pytest.param({"ngroups": 1, "norm_before_gate": True}, id="norm-before-gate"),
    pytest.param({"ngroups": 1, "rmsnorm": False, "D_has_hdim": True, "dt_limit": (0.0, 0.05)},
                 id="no-norm-D-hdim-dt_limit"),
    pytest.param({"ngroups": 2, "d_ssm": 32, "bias": True}, id="d_mlp-G2-bias"),
]
# (dtype, atol): the module built in that dtype.
DTYPES = [pytest.param(torch.float32, 2e-5, id="fp32"), pytest.param(torch.bfloat16, 2e-2, id="bf16")]


@pytest.mark.parametrize("dtype,atol", DTYPES)
@pytest.mark.parametrize("options", OPTIONS)
def test_patched_mamba2_fused_path_matches_the_reference(modules, monkeypatch, options, dtype, atol):
    Mamba2 = modules["mamba2"].Mamba2
    torch.manual_seed(0)
    dims = {"d_model": 32, "d_state": 16, "headdim": 16, "chunk_size": 16}
    reference = Mamba2(**dims, **options)  # built unpatched; use_mem_eff_path=True, the default
    assert reference.use_mem_eff_path
    with torch.no_grad():
        for p in reference.parameters():  # away from the init (norm weight 1, D 1)
            p.add_(0.1 * torch.randn_like(p))
    reference = reference.to(dtype)
    u = torch.randn(2, 40, 32).to(dtype)  # seqlen 40: a partial last chunk
    dout = torch.randn(2, 40, 32).to(dtype)
    patched = copy.deepcopy(reference)
    calls = []
    real = mamba_tune.mamba_split_conv1d_scan_combined

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    with mamba_tune.patched_mamba_ssm(strict=True):
        assert modules["mamba2"].mamba_split_conv1d_scan_combined is real
        monkeypatch.setattr(modules["mamba2"], "mamba_split_conv1d_scan_combined", counted)
        got = _grads(patched, u, dout)
        monkeypatch.undo()
    assert calls == [1], "the patched module did not run mamba_tune's fused layer"
    ref32 = _reference(modules, monkeypatch, copy.deepcopy(reference).float(), u.float(), dout.float(), upcast=True)
    low = _reference(modules, monkeypatch, copy.deepcopy(reference), u, dout, upcast=False)
    assert set(got) == set(ref32) == set(low)
    assert got["out"].dtype == dtype
    for name in sorted(got):
        g, r, lo = got[name].float(), ref32[name].float(), low[name].float()
        assert not g.isnan().any(), f"{name}: NaN"
        err = (g - r).abs().max().item()
        bound = 2 * (lo - r).abs().max().item() + atol * max(1.0, r.abs().max().item())
        assert err <= bound, f"{name}: max error {err:.3e} > 2 * eager-{dtype} error + atol * scale = {bound:.3e}"


@pytest.mark.parametrize("dtype,atol", DTYPES)
def test_patched_mamba2_simple_with_learnable_initial_states(modules, monkeypatch, dtype, atol):
    """Mamba2Simple's fused path passes initial_states (its learnable init_states, per batch row)
    and norm_before_gate=False. ngroups 1: its unfused path normalizes whole rows, its fused path
    in ngroups groups (mamba-ssm's own difference), which agree only then."""
    Mamba2Simple = modules["mamba2_simple"].Mamba2Simple
    torch.manual_seed(0)
    reference = Mamba2Simple(d_model=32, d_state=16, headdim=16, ngroups=1, chunk_size=16,
                             learnable_init_states=True)
    assert reference.use_mem_eff_path
    with torch.no_grad():
        for p in reference.parameters():  # away from the init (init_states 0, norm weight 1, D 1)
            p.add_(0.1 * torch.randn_like(p))
    reference = reference.to(dtype)
    u, dout = torch.randn(2, 40, 32).to(dtype), torch.randn(2, 40, 32).to(dtype)
    patched = copy.deepcopy(reference)
    with mamba_tune.patched_mamba_ssm(strict=True):
        got = _grads(patched, u, dout)
    ref32 = _reference(modules, monkeypatch, copy.deepcopy(reference).float(), u.float(), dout.float(), upcast=True,
                       where="mamba2_simple")
    low = _reference(modules, monkeypatch, copy.deepcopy(reference), u, dout, upcast=False, where="mamba2_simple")
    assert "init_states" in got and set(got) == set(ref32)
    for name in sorted(got):
        g, r, lo = got[name].float(), ref32[name].float(), low[name].float()
        err = (g - r).abs().max().item()
        bound = 2 * (lo - r).abs().max().item() + atol * max(1.0, r.abs().max().item())
        assert err <= bound, f"{name}: max error {err:.3e} > 2 * eager-{dtype} error + atol * scale = {bound:.3e}"
