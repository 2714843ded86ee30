"""mamba-ssm's own `Mamba2` module, patched, against the same module on the fp32 references.

The module is mamba-ssm 2.3.2.post1's code (CI installs its Python sources without CUDA;
see tests/mamba_ssm_cpu.py), with `use_mem_eff_path=False` (the fused path has no kernel
here yet) and torch's conv1d (no causal_conv1d). Patched, its SSD and gated norm run the
kernels in Helion ref mode; the reference is the same module whose `mamba_chunk_scan_combined`
and `rmsnorm_fn` are the fp32 references of autotune_cli.reference. Inference only: the SSD
backward is not written yet (the kernels refuse inputs that require grad).

Bound: err(patched) <= 2 * err(reference evaluated in the module's dtype) + atol, against
the reference in fp32 on the same (rounded) weights and input.
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

pytestmark = [pytest.mark.usefixtures("ssd_ref_mode"),
              pytest.mark.skipif(not mamba_ssm_cpu.installed(),
                                 reason="mamba-ssm is not installed (.ci/run installs it)")]


@pytest.fixture
def modules() -> Iterator[dict[str, Any]]:
    mamba_ssm_cpu.load()
    from mamba_ssm.modules import mamba2
    from mamba_ssm.ops.triton import layernorm_gated

    mamba_tune.unpatch_mamba_ssm()
    yield {"mamba2": mamba2, "layernorm_gated": layernorm_gated}
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


def _reference_forward(modules, monkeypatch, module, u, upcast: bool) -> torch.Tensor:
    ssd, rmsnorm = _reference_fns(upcast)
    with monkeypatch.context() as m:
        m.setattr(modules["mamba2"], "mamba_chunk_scan_combined", ssd)
        m.setattr(modules["layernorm_gated"], "rmsnorm_fn", rmsnorm)  # what mamba-ssm's RMSNorm calls
        return module(u)


# Module options: the norm gate (rmsnorm=True, z into the norm with group_size
# d_ssm / ngroups) or z into the SSD (rmsnorm=False), D per head or per channel,
# and a dt_limit.
OPTIONS = [
    pytest.param({"ngroups": 2}, id="rmsnorm-G2"),
    pytest.param({"ngroups": 1, "rmsnorm": False, "D_has_hdim": True, "dt_limit": (0.0, 0.05)},
                 id="z-in-ssd-D-hdim-dt_limit"),
    pytest.param({"ngroups": 4, "norm_before_gate": True}, id="norm-before-gate-G4"),
]
# (dtype, atol): the module built in that dtype (bf16: bf16 norm weight, weight_fp32=0).
DTYPES = [pytest.param(torch.float32, 1e-4, id="fp32"), pytest.param(torch.bfloat16, 2e-2, id="bf16")]


@pytest.mark.parametrize("dtype,atol", DTYPES)
@pytest.mark.parametrize("options", OPTIONS)
def test_patched_mamba2_forward_matches_the_reference(modules, monkeypatch, options, dtype, atol):
    Mamba2 = modules["mamba2"].Mamba2
    torch.manual_seed(0)
    dims = {"d_model": 64, "d_state": 16, "headdim": 16, "chunk_size": 16, "use_mem_eff_path": False}
    reference = Mamba2(**dims, **options)  # built unpatched: mamba-ssm's norm class
    with torch.no_grad():
        for p in reference.parameters():  # away from the init (norm weight 1, D 1)
            p.add_(0.1 * torch.randn_like(p))
    reference = reference.to(dtype)
    u = torch.randn(2, 40, 64).to(dtype)  # seqlen 40: a partial last chunk
    with mamba_tune.patched_mamba_ssm():
        patched = Mamba2(**dims, **options, dtype=dtype)
    assert reference.rmsnorm is False or type(patched.norm) is mamba_tune.RMSNormGated
    patched.load_state_dict(reference.state_dict())
    with torch.no_grad():
        with mamba_tune.patched_mamba_ssm():
            out = patched(u)
        ref32 = _reference_forward(modules, monkeypatch, copy.deepcopy(reference).float(), u.float(), upcast=True)
        low = _reference_forward(modules, monkeypatch, reference, u, upcast=False)
    assert out.shape == u.shape and out.dtype == dtype and not out.isnan().any()
    err = (out.float() - ref32).abs().max().item()
    bound = 2 * (low.float() - ref32).abs().max().item() + atol
    assert err <= bound, f"max error {err:.3e} > 2 * eager-{dtype} error + atol = {bound:.3e}"
