"""The fused layer compiled for real on a CUDA GPU (`pytest tests/layer -m gpu`).

At Nemotron-3 Nano's Mamba-2 dims (nheads 64, headdim 64, ngroups 8, dstate 128,
chunk_size 128, bf16): `mamba_split_conv1d_scan_combined` against mamba-ssm's own fused
function on the same inputs, both against the fp32 reference (autograd through
`split_conv1d_scan_ref` on the GPU): our error within twice mamba-ssm's plus atol, for the
output, final_states and every gradient. Bitwise-equal gradients across runs; peak memory of
a forward+backward and the memory kept between forward and backward no higher than mamba-ssm's;
mamba-ssm's `Mamba2` (use_mem_eff_path=True) patched vs unpatched, forward and backward.
mamba-ssm's fused function needs the causal-conv1d package: those tests skip without it.
Without a norm and with d_mlp, mamba-ssm's backward cannot give out_proj's weight gradient
(mamba_ssm_fused.py says why and how `mamba_ssm_grads` works around it).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from layer_inputs import Layer
from mamba_ssm_fused import OPTIONS, assert_bounded, grads, mamba_ssm_grads, reference_grads

import mamba_tune

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NANO = {"nheads": 64, "headdim": 64, "ngroups": 8, "dstate": 128, "chunk_size": 128, "out_dim": 2688,
        "norm_before_gate": False, "outproj_bias": False, "rmsnorm_eps": 1e-5}
ATOL = 1e-2


def _mamba_ssm_fused() -> Any:
    try:
        from mamba_ssm.ops.triton import ssd_combined
    except ImportError:
        pytest.skip("mamba-ssm is not importable")
    if getattr(ssd_combined, "causal_conv1d_fwd_function", None) is None:
        pytest.skip("mamba-ssm's fused layer needs the causal-conv1d package")
    if mamba_tune.is_patched():
        mamba_tune.unpatch_mamba_ssm()
    return ssd_combined.mamba_split_conv1d_scan_combined


def _assert_bounded(name: str, ours: torch.Tensor, ref: torch.Tensor, theirs: torch.Tensor) -> None:
    assert_bounded(name, ours, ref, theirs, ATOL)


def _layer(options: dict[str, Any], seed: int = 0, batch: int = 2, seqlen: int = 4096) -> Layer:
    return Layer.make(torch.bfloat16, seed, device="cuda", batch=batch, seqlen=seqlen, **{**NANO, **options})


def _out_grads(layer: Layer, with_dfinal: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    b, s = layer.tensors["zxbcdt"].shape[:2]
    dout = torch.randn(b, s, NANO["out_dim"], generator=gen, device="cuda").to(torch.bfloat16)
    dfinal = (torch.randn(b, NANO["nheads"], NANO["headdim"], NANO["dstate"], generator=gen, device="cuda")
              if with_dfinal else None)
    return dout, dfinal


@pytest.mark.parametrize("options,with_dfinal", OPTIONS)
def test_forward_and_gradients_vs_mamba_ssm_fused(options, with_dfinal):
    theirs_fn = _mamba_ssm_fused()
    layer = _layer(options)
    dout, dfinal = _out_grads(layer, with_dfinal)
    ours = grads(mamba_tune.mamba_split_conv1d_scan_combined, layer, dout, dfinal)
    theirs = mamba_ssm_grads(theirs_fn, layer, dout, dfinal)  # works around its no-norm d_mlp bug
    ref = reference_grads(layer, dout, dfinal)
    assert set(ours) == set(theirs) == set(ref)
    for name in sorted(ours):
        _assert_bounded(name, ours[name], ref[name], theirs[name])


# transformers' tiny Mamba2 (tests/hf_tiny.py: hidden 32, expand 2, 4 heads of 16, 2 groups,
# dstate 16, chunk 16), its training batch (4 x 256) and options (norm after the gate, eps 1e-5).
TINY_MAMBA2 = {"nheads": 4, "headdim": 16, "ngroups": 2, "dstate": 16, "chunk_size": 16, "out_dim": 32,
               "norm_before_gate": False, "outproj_bias": False, "rmsnorm_eps": 1e-5}


def test_layer_at_transformers_tiny_mamba2_dims_vs_mamba_ssm_fused():
    """On the H200 the tiny Mamba2's training gradients, patched, were 2.2-4x further
    from fp32 than its own path's (mamba-ssm's fused layer); on the CPU (ref mode) ours is as close
    as eager bf16. This is the layer alone at those dims against mamba-ssm's fused function, with
    a bound relative to each gradient's size (the Nano test's atol is at least 1e-2 absolute, looser
    than these gradients): it says whether the gap is in the layer. Errors are printed (-s)."""
    theirs_fn = _mamba_ssm_fused()
    layer = Layer.make(torch.bfloat16, 0, device="cuda", batch=4, seqlen=256, **TINY_MAMBA2)
    gen = torch.Generator(device="cuda").manual_seed(1)
    dout = torch.randn(4, 256, TINY_MAMBA2["out_dim"], generator=gen, device="cuda").to(torch.bfloat16)
    ours = grads(mamba_tune.mamba_split_conv1d_scan_combined, layer, dout, None)
    theirs = mamba_ssm_grads(theirs_fn, layer, dout, None)
    ref = reference_grads(layer, dout, None)
    errs = {name: ((ours[name].float() - ref[name].float()).abs().max().item(),
                   (theirs[name].float() - ref[name].float()).abs().max().item(),
                   ref[name].abs().max().item()) for name in sorted(ours)}
    for name, (e_ours, e_theirs, size) in errs.items():
        print(f"\n  {name}: ours {e_ours:.3e} / mamba-ssm {e_theirs:.3e} (max |fp32| {size:.3e})", end="")
    for name, (e_ours, e_theirs, size) in errs.items():
        assert e_ours <= 2 * e_theirs + 1e-2 * size, f"{name}: max error {e_ours:.3e} > 2 * {e_theirs:.3e} + 1% of {size:.3e}"


def test_gradients_are_bitwise_reproducible():
    layer = _layer({"seq_idx": True, "initial_states": True})
    dout, dfinal = _out_grads(layer, True)
    fn = mamba_tune.mamba_split_conv1d_scan_combined
    first, second = grads(fn, layer, dout, dfinal), grads(fn, layer, dout, dfinal)
    for name in first:
        assert torch.equal(first[name], second[name]), f"{name} differs between two runs"


def _memory(fn: Any, layer: Layer, dout: torch.Tensor) -> tuple[float, float]:
    """(MiB kept between forward and backward, MiB peak of forward + backward), above the inputs."""
    leaves = layer.leaves()
    args, kw = layer.call_args(leaves)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn(*args, **kw)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    grads = torch.autograd.grad(out, list(leaves.values()), dout)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del grads, out
    return kept / 2**20, peak / 2**20


def test_memory_no_higher_than_mamba_ssms():
    theirs_fn = _mamba_ssm_fused()
    layer = _layer({})  # the shapes of the first test: no compiles of its own
    dout, _ = _out_grads(layer, False)
    fn = mamba_tune.mamba_split_conv1d_scan_combined
    _memory(fn, layer, dout)  # compile and resolve configs first
    _memory(theirs_fn, layer, dout)
    ours_kept, ours_peak = _memory(fn, layer, dout)
    theirs_kept, theirs_peak = _memory(theirs_fn, layer, dout)
    assert ours_kept <= theirs_kept, f"kept for the backward: ours {ours_kept:.0f} MiB > mamba-ssm {theirs_kept:.0f}"
    assert ours_peak <= theirs_peak, f"peak: ours {ours_peak:.0f} MiB > mamba-ssm {theirs_peak:.0f} MiB"


def test_patched_mamba2_vs_unpatched_forward_and_backward():
    _mamba_ssm_fused()
    from mamba_ssm.modules.mamba2 import Mamba2

    torch.manual_seed(0)
    # Nano-like: d_inner 4096 (64 heads of 64), 8 groups, dstate 128, chunk 128.
    module = Mamba2(d_model=2048, d_state=128, headdim=64, ngroups=8, chunk_size=128, device="cuda",
                    dtype=torch.bfloat16)
    assert module.use_mem_eff_path
    u = torch.randn(2, 4096, 2048, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn_like(u)

    def step(m: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        x = u.detach().clone().to(dtype).requires_grad_()
        m.zero_grad(set_to_none=True)
        out = m(x)
        out.backward(dout.to(dtype))
        return {"out": out.detach(), "d_input": x.grad, **{n: p.grad for n, p in m.named_parameters()}}

    theirs = step(module, torch.bfloat16)
    ref = step(copy.deepcopy(module).float(), torch.float32)  # mamba-ssm's fused path in fp32
    patched = copy.deepcopy(module)
    with mamba_tune.patched_mamba_ssm(strict=True):
        ours = step(patched, torch.bfloat16)
    assert set(ours) == set(theirs) == set(ref)
    for name in sorted(theirs):
        _assert_bounded(name, ours[name], ref[name], theirs[name])
