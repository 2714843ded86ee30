"""The conv1d kernels compiled for real on a CUDA GPU, at model sizes (`pytest tests/conv1d -m gpu`).

Nemotron-3 Nano's xBC (batch 2, seqlen 8192, dim 6144 at TP 1, width 4, bf16) in the
channel-last layout Mamba2 passes, and the contiguous layout; with the configs the
runtime picks (tuned bundles, else the kernels' defaults). Our error against the fp32
reference must be within twice eager bf16's plus atol; where the causal-conv1d package
is importable, within twice its error too. The backward must give the same bits on
every run (no atomics).
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.reference import causal_conv1d_ref, causal_conv1d_update_ref
from autotune_cli.tuning.conv1d import causal_conv1d_package
from mamba_tune.conv1d import (
    causal_conv1d_fn,
    causal_conv1d_update,
    conv1d_backward,
    conv1d_forward,
)

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SIZES = {"nemotron3-nano": (2, 8192, 6144), "odd": (3, 1000, 200)}
ATOL = 1e-2


def _inputs(batch: int, seqlen: int, dim: int, channel_last: bool, packed: bool, seed: int = 0):
    gen = torch.Generator(device="cpu").manual_seed(seed)
    dev = torch.device("cuda")
    if channel_last:
        x = torch.randn(batch, seqlen, dim, generator=gen).bfloat16().to(dev).transpose(1, 2)
        dout = torch.randn(batch, seqlen, dim, generator=gen).bfloat16().to(dev).transpose(1, 2)
    else:
        x = torch.randn(batch, dim, seqlen, generator=gen).bfloat16().to(dev)
        dout = torch.randn(batch, dim, seqlen, generator=gen).bfloat16().to(dev)
    weight = (torch.randn(dim, 4, generator=gen) * 0.5).bfloat16().to(dev)
    bias = (torch.randn(dim, generator=gen) * 0.1).bfloat16().to(dev)
    seq_idx = None
    if packed:
        pos = torch.arange(seqlen)
        seq_idx = ((pos >= seqlen // 3).int() + (pos >= seqlen // 2).int())[None].repeat(batch, 1)
        seq_idx = seq_idx.to(torch.int32).to(dev)
    return x, weight, bias, seq_idx, dout


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _grads(fn, x, weight, bias, dout):
    leaves = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    out = fn(*leaves)
    grads = torch.autograd.grad(out, leaves, dout)
    return out.detach(), grads


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
@pytest.mark.parametrize("channel_last", [True, False], ids=["channel_last", "contiguous"])
@pytest.mark.parametrize("size", list(SIZES))
def test_forward_and_backward_within_eager_error(size: str, channel_last: bool, packed: bool) -> None:
    x, weight, bias, seq_idx, dout = _inputs(*SIZES[size], channel_last, packed)

    def ours(x, w, b):
        return causal_conv1d_fn(x, w, b, seq_idx, activation="silu")

    def ref(upcast):
        return lambda x, w, b: causal_conv1d_ref(x, w, b, seq_idx, activation="silu", upcast=upcast)[0]

    out, grads = _grads(ours, x, weight, bias, dout)
    ref_out, ref_grads = _grads(ref(True), x, weight, bias, dout)
    low_out, low_grads = _grads(ref(False), x, weight, bias, dout)
    assert not out.isnan().any()
    assert out.stride() == x.stride()
    assert _err(out, ref_out) <= 2 * _err(low_out, ref_out) + ATOL
    for name, g, r, lo in zip(("dx", "dweight", "dbias"), grads, ref_grads, low_grads, strict=True):
        bound = 2 * _err(lo, r) + ATOL * max(1.0, r.abs().max().item())
        assert _err(g, r) <= bound, f"{name}: {_err(g, r):.3e} > {bound:.3e}"
    found = causal_conv1d_package()
    if found is not None and channel_last:
        pkg = found[0]
        theirs, their_grads = _grads(lambda x, w, b: pkg.causal_conv1d_fn(x, w, b, seq_idx, activation="silu"),
                                     x, weight, bias, dout)
        assert _err(out, ref_out) <= 2 * _err(theirs, ref_out) + ATOL
        for name, g, r, t in zip(("dx", "dweight", "dbias"), grads, ref_grads, their_grads, strict=True):
            assert _err(g, r) <= 2 * _err(t, r) + ATOL * max(1.0, r.abs().max().item()), name


@pytest.mark.parametrize("channel_last", [True, False], ids=["channel_last", "contiguous"])
def test_states_and_explicit_api(channel_last: bool) -> None:
    x, weight, bias, _, dout = _inputs(2, 777, 96, channel_last, False)
    init = torch.randn(2, 96, 3, device="cuda").bfloat16()
    final = torch.empty(2, 96, 3, device="cuda", dtype=torch.bfloat16)
    out = conv1d_forward(x, weight, bias, None, init, final, True)
    ref_out, ref_final = causal_conv1d_ref(x, weight, bias, None, init, "silu")
    assert _err(out, ref_out) <= 2e-2 and torch.equal(final, ref_final)
    dfinal = torch.randn(2, 96, 3, device="cuda").bfloat16()
    dx, dw, db, dinit = conv1d_backward(x, weight, bias, dout, None, init, dfinal, None, True, True)
    leaves = [t.float().requires_grad_() for t in (x, weight, bias, init)]
    o, f = causal_conv1d_ref(leaves[0], leaves[1], leaves[2], None, leaves[3], "silu")
    ref = torch.autograd.grad([o, f], leaves, [dout.float(), dfinal.float()])
    for name, g, r in zip(("dx", "dweight", "dbias", "dinit"), (dx, dw, db, dinit), ref, strict=True):
        assert _err(g, r) <= 2e-2 * max(1.0, r.abs().max().item()), name


@pytest.mark.parametrize("channel_last", [True, False], ids=["channel_last", "contiguous"])
def test_backward_is_bitwise_deterministic(channel_last: bool) -> None:
    x, weight, bias, seq_idx, dout = _inputs(2, 4096, 1024, channel_last, True)
    runs = [conv1d_backward(x, weight, bias, dout, seq_idx, None, None, None, False, True)[:3] for _ in range(3)]
    for other in runs[1:]:
        for a, b in zip(runs[0], other, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["shift", "circular-slots"])
def test_decode_step(mode: str) -> None:
    gen = torch.Generator(device="cpu").manual_seed(0)
    batch, dim = 4, 6144
    x = torch.randn(batch, dim, generator=gen).bfloat16().cuda()
    weight = (torch.randn(dim, 4, generator=gen) * 0.5).bfloat16().cuda()
    bias = torch.randn(dim, generator=gen).bfloat16().cuda()
    nslots = batch + 3
    state = torch.randn(nslots, 4, dim, generator=gen).bfloat16().cuda().transpose(1, 2)  # mamba-ssm's layout
    cache = idx = None
    if mode == "circular-slots":
        cache = torch.tensor([0, 5, 17, 3], dtype=torch.int32, device="cuda")
        idx = torch.tensor([6, 0, -1, 2], dtype=torch.int32, device="cuda")
    else:
        state = state[:batch]
    ours, theirs = state.clone(), state.clone()
    out = causal_conv1d_update(x, ours, weight, bias, "silu", cache, idx)
    ref = causal_conv1d_update_ref(x, theirs, weight, bias, "silu", cache, idx)
    assert torch.equal(ours, theirs)
    assert _err(out, ref) <= 2e-2
    found = causal_conv1d_package()
    if found is not None:
        pkg_state = state.clone()
        their_out = found[0].causal_conv1d_update(x, pkg_state, weight, bias, "silu", cache, idx)
        assert torch.equal(ours, pkg_state)
        assert _err(out, their_out) <= 2e-2



@pytest.mark.parametrize("kernel", ["causal_conv1d_fwd", "causal_conv1d_bwd_slide"])
def test_the_sweeps_baselines_call_the_functions_the_layer_calls(kernel: str) -> None:
    """With causal-conv1d installed the tuning records time `causal_conv1d.cpp_functions` (what
    mamba-ssm's fused layer calls), not `causal_conv1d_fn`'s autograd, and the baseline computes
    what our kernel does on the same inputs (its output or dx within bf16 rounding)."""
    from autotune_cli.tuning import ModelShape, get
    from autotune_cli.tuning.conv1d import ConvInputs, _baseline_bwd, _baseline_fwd

    if causal_conv1d_package() is None:
        pytest.skip("causal-conv1d is not installed")
    # The layer's rows 296 elements apart (in_proj's width): causal-conv1d takes channel-last rows
    # only at multiples of 8 elements, as every preset's in_proj width is (4 heads x 32 gave 292).
    dims = get(kernel).dims_for(ModelShape(batch=2, seqlen=1000, nheads=8, headdim=16, ngroups=1, dstate=16,
                                           chunk_size=64))
    assert dims["row_stride"] == 296
    dev = torch.device("cuda")
    fwd = kernel == "causal_conv1d_fwd"
    base = (_baseline_fwd if fwd else _baseline_bwd)(dims, torch.bfloat16, dev, 0)
    assert base is not None
    assert ("causal_conv1d_fwd_function" if fwd else "causal_conv1d_bwd_function") in base.name, base.name
    theirs = base.fn()
    inp = ConvInputs(dims, torch.bfloat16, dev, 0)  # the baseline's inputs (same seed)
    if fwd:
        mine = conv1d_forward(inp.x, inp.weight, inp.bias, None, None, None, True)
        assert _err(theirs, mine) <= ATOL
    else:
        mine = conv1d_backward(inp.x, inp.weight, inp.bias, inp.dout, None, None, None, None, False, True)
        assert _err(theirs[0], mine[0]) <= ATOL
