"""mamba-ssm's own `Mamba2` module, patched, against the same module on the fp32 references.

The module is mamba-ssm 2.3.2.post1's code (CI installs its Python sources without CUDA;
see tests/mamba_ssm_cpu.py), with `use_mem_eff_path=False` (the fused path:
tests/layer/test_mamba2_module.py) and no causal-conv1d package. Patched, its conv1d, SSD and
gated norm run the kernels in Helion ref mode (the patch fills the module's missing
causal_conv1d_fn); the reference is the same module unpatched - torch's nn.Conv1d - whose
`mamba_chunk_scan_combined` and `rmsnorm_fn` are the fp32 references of autotune_cli.reference.
Forward only here; the training step is tests/layer/test_mamba2_module.py's and the GPU tests'.

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
from autotune_cli.reference import causal_conv1d_ref, gated_norm_ref, ssd_chunked_ref

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


def _reference_forward(modules, monkeypatch, module, u, upcast: bool, **kwargs: Any) -> torch.Tensor:
    ssd, rmsnorm = _reference_fns(upcast)
    with monkeypatch.context() as m:
        m.setattr(modules["mamba2"], "mamba_chunk_scan_combined", ssd)
        m.setattr(modules["layernorm_gated"], "rmsnorm_fn", rmsnorm)  # what mamba-ssm's RMSNorm calls
        return module(u, **kwargs)


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


def test_patched_mamba2_runs_packed_sequences_without_causal_conv1d(modules, monkeypatch):
    # Unpatched, without the causal-conv1d package, Mamba2 asserts seq_idx is None ("varlen conv1d
    # requires the causal_conv1d package"). Patched, its conv1d is ours, which restarts at each
    # packed sequence; the reference is the module with the fp32 conv1d, SSD and norm references.
    Mamba2 = modules["mamba2"].Mamba2
    assert modules["mamba2"].causal_conv1d_fn is None  # no package here (the CPU CI)
    torch.manual_seed(0)
    dims = {"d_model": 64, "d_state": 16, "headdim": 16, "chunk_size": 16, "ngroups": 2, "use_mem_eff_path": False}
    module = Mamba2(**dims)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    u = torch.randn(2, 40, 64)
    seq_idx = torch.zeros(2, 40, dtype=torch.int32)
    seq_idx[0, 13:] += 1
    seq_idx[0, 29:] += 1  # three sequences in row 0 (boundaries inside chunks), one in row 1
    seq_idx[1, 18:] += 1
    with torch.no_grad(), pytest.raises(AssertionError, match="causal_conv1d"):
        module(u, seq_idx=seq_idx)
    with torch.no_grad():
        with mamba_tune.patched_mamba_ssm():
            assert modules["mamba2"].causal_conv1d_fn is mamba_tune.causal_conv1d_fn
            out = module(u, seq_idx=seq_idx)
        assert modules["mamba2"].causal_conv1d_fn is None  # unpatched: the module's None again

        def conv(x, weight, bias=None, activation=None, seq_idx=None):
            return causal_conv1d_ref(x, weight, bias, seq_idx, None, activation)[0]

        with monkeypatch.context() as m:
            m.setattr(modules["mamba2"], "causal_conv1d_fn", conv)
            ref = _reference_forward(modules, monkeypatch, module, u, upcast=True, seq_idx=seq_idx)
        unpacked = _reference_forward(modules, monkeypatch, module, u, upcast=True)  # torch conv, one sequence
    assert (ref - unpacked).abs().max() > 1e-2  # the packing changes the output: the check below is not vacuous
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


def test_patched_mamba2_decode_step_without_causal_conv1d(modules, monkeypatch):
    # Mamba2.step with neither causal-conv1d nor the decode kernel runs torch ops (the reference,
    # ngroups 1 as that path requires); patched, its conv update and state update are ours. Both
    # states are updated in place: compare them too.
    Mamba2 = modules["mamba2"].Mamba2
    torch.manual_seed(0)
    module = Mamba2(d_model=64, d_state=16, headdim=16, chunk_size=16, ngroups=1)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    conv_state, ssm_state = module.allocate_inference_cache(3, 1)  # conv_state as the module lays it out
    conv_state.normal_()
    ssm_state.normal_()
    u = torch.randn(3, 1, 64)
    with torch.no_grad():
        with mamba_tune.patched_mamba_ssm():
            assert modules["mamba2"].causal_conv1d_update is mamba_tune.causal_conv1d_update
            ours = module.step(u, conv_state.clone(), ssm_state.clone())
        _, rmsnorm = _reference_fns(upcast=True)
        with monkeypatch.context() as m:
            m.setattr(modules["mamba2"], "selective_state_update", None)  # mamba-ssm's torch path
            m.setattr(modules["layernorm_gated"], "rmsnorm_fn", rmsnorm)
            ref = module.step(u, conv_state.clone(), ssm_state.clone())
    for name, a, b in zip(("out", "conv_state", "ssm_state"), ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
