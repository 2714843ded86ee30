"""The GPU test's comparison with mamba-ssm's fused layer, run on CPU (Helion ref mode).

mamba-ssm's `mamba_split_conv1d_scan_combined` runs its own forward and backward glue with
torch stand-ins for its CUDA / Triton leaves (mamba_ssm_fused.cpu_fused). On the H200 the
GPU test's no-norm-d_mlp case failed: mamba-ssm's backward cannot give out_proj's weight
gradient without a norm and with d_mlp (mamba_ssm_fused.py's docstring), so the comparison
raised before checking a number. These tests pin that bug and run the GPU test's four cases
through `mamba_ssm_grads` (which works around it) at small dims.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from layer_inputs import Layer
from mamba_ssm_fused import (
    OPTIONS,
    assert_bounded,
    cpu_fused,
    grads,
    mamba_ssm_grads,
    reference_grads,
)

import mamba_tune
from autotune_cli.reference import split_conv1d_scan_ref

pytestmark = pytest.mark.usefixtures("layer_ref_mode")

# The GPU test's options (Nemotron-3 Nano's norm placement, eps, no out_proj bias) at small dims.
SMALL = {"nheads": 4, "headdim": 8, "ngroups": 2, "dstate": 16, "chunk_size": 16, "out_dim": 24,
         "norm_before_gate": False, "outproj_bias": False, "rmsnorm_eps": 1e-5}


def _case(options: dict[str, Any], with_dfinal: bool, dtype: torch.dtype
          ) -> tuple[Layer, torch.Tensor, torch.Tensor | None]:
    layer = Layer.make(dtype, 0, seqlen=40, **{**SMALL, **options})
    gen = torch.Generator().manual_seed(1)
    dout = torch.randn(2, 40, SMALL["out_dim"], generator=gen).to(dtype)
    dfinal = torch.randn(2, SMALL["nheads"], SMALL["headdim"], SMALL["dstate"], generator=gen) if with_dfinal else None
    return layer, dout, dfinal


def test_mamba_ssms_backward_has_no_outproj_weight_gradient_without_norm_with_d_mlp(monkeypatch):
    """mamba-ssm 2.3.2.post1's bug that `mamba_ssm_grads` works around: called plainly, its
    backward hands autograd a (out_dim, dim) weight gradient for a (out_dim, d_mlp + dim)
    weight. (Should a later mamba-ssm fix it, this fails, and the workaround can go.)"""
    with cpu_fused(monkeypatch) as theirs:
        layer, dout, _ = _case({"rmsnorm": False, "d_mlp": 6}, False, torch.float32)
        with pytest.raises(RuntimeError, match=r"invalid gradient .* got \[24, 32\] but expected shape compatible "
                                               r"with \[24, 38\]"):
            grads(theirs, layer, dout, None)
        # With a norm its backward does take the SwiGLU part.
        layer, dout, _ = _case({"d_mlp": 6}, False, torch.float32)
        assert grads(theirs, layer, dout, None)["outproj_weight"].shape == (24, 38)


@pytest.mark.parametrize("options,with_dfinal", OPTIONS)
def test_the_gpu_comparison_in_fp32_gives_the_references_gradients(monkeypatch, options, with_dfinal):
    """In fp32 the stand-ins are exact, so mamba-ssm's glue (with the workaround where needed)
    must give the fp32 reference's output and every gradient: the workaround's out_proj weight
    gradient is mamba-ssm's semantics, and the reference is mamba-ssm's for every GPU case."""
    layer, dout, dfinal = _case(options, with_dfinal, torch.float32)
    with cpu_fused(monkeypatch) as fused:
        theirs = mamba_ssm_grads(fused, layer, dout, dfinal)
    ref = reference_grads(layer, dout, dfinal)
    assert set(theirs) == set(ref) == {"out", "final_states", *(k for k, v in layer.tensors.items() if v is not None)}
    for name, t in ref.items():
        err = (theirs[name] - t).abs().max().item()
        assert err <= 1e-5 * max(1.0, t.abs().max().item()), f"{name}: mamba-ssm's glue vs reference {err:.3e}"


def _eager(*args: Any, return_final_states: bool, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return split_conv1d_scan_ref(*args, upcast=False, **kw)


@pytest.mark.parametrize("options,with_dfinal", OPTIONS)
def test_the_gpu_comparison_in_bf16(monkeypatch, options, with_dfinal):
    """The GPU test's body at small dims: ours within twice the error of mamba-ssm's glue plus
    atol, for the output, final_states and every gradient. Its stand-in leaves are exact (its
    error is rounding only, less than its kernels' on the GPU), so the bound takes the larger of
    its error and eager PyTorch's in bf16 (the CPU layer tests' bound)."""
    layer, dout, dfinal = _case(options, with_dfinal, torch.bfloat16)
    ours = grads(mamba_tune.mamba_split_conv1d_scan_combined, layer, dout, dfinal)
    with cpu_fused(monkeypatch) as fused:
        theirs = mamba_ssm_grads(fused, layer, dout, dfinal)
    eager = grads(_eager, layer, dout, dfinal)
    ref = reference_grads(layer, dout, dfinal)
    assert set(ours) == set(theirs) == set(eager) == set(ref)
    for name in sorted(ours):
        worse = max(theirs[name], eager[name], key=lambda t: (t.float() - ref[name]).abs().max().item())
        assert_bounded(name, ours[name], ref[name], worse, 1e-2)
