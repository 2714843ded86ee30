"""Every option combination of `causal_conv1d_fn` and `causal_conv1d_update`, as causal-conv1d's own
test suite runs them against its package (tests/test_causal_conv1d.py there): compiled on a GPU
(`pytest -m gpu`, dim 64, fp32) at sequence lengths 1, 2, 16, 151 and 784, and for their logic in
Helion ref mode on the CPU at small dims and lengths up to 151. Each combination runs at one of the
lengths, the lengths assigned so that each value of every option meets every length
(`test_every_option_meets_every_length`). The kernels are compiled for static shapes, so each
(combination, length) is a compile of its own: the whole cross product (1080 GPU tests) took
about 2 s a test on an H100, over half an hour.

causal_conv1d_fn: width 2-4, bias or not, SiLU or not, contiguous or channel-last x, and no states,
seq_idx (packed sequences, with padding), initial states, initial and final states, or final states
only; forward, final states and every gradient against the fp32 reference with autograd.
causal_conv1d_update: width 2-4, bias, SiLU, the circular buffer (cache_seqlens), state slots
(conv_state_indices, with a padding slot), state_len width - 1 or longer; output and updated state.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from autotune_cli.reference import causal_conv1d_ref, causal_conv1d_update_ref
from mamba_tune.conv1d import causal_conv1d_fn, causal_conv1d_update

SEQLENS = (1, 2, 16, 151, 784)
CPU_SEQLENS = (1, 2, 16, 151)  # 784 in ref mode's small blocks: minutes for nothing new
STATES = ("none", "seq_idx", "init", "init-final", "final")
FN_COMBOS = list(itertools.product((2, 3, 4), (0, 1), (0, 1), ("contiguous", "channel_last"), STATES))
UPDATE_COMBOS = list(itertools.product((2, 3, 4), (0, 1), (0, 1), (0, 1), (0, 1), ("short", "long")))


def length_of(combos: list[tuple], combo: tuple, lengths: tuple[int, ...]) -> int:
    """The sequence length `combo` runs at: the sum of its options' value indices modulo the
    number of lengths. With one option's value fixed, the others' sums run through at least that
    many consecutive integers, so each value of each option meets every length."""
    values = [list(dict.fromkeys(c[k] for c in combos)) for k in range(len(combo))]
    return lengths[sum(v.index(x) for v, x in zip(values, combo, strict=True)) % len(lengths)]


def _fn_id(c: tuple) -> str:
    width, bias, silu, layout, states = c
    return f"W{width}-{'bias' if bias else 'nobias'}-{'silu' if silu else 'linear'}-{layout}-{states}"


def _update_id(c: tuple) -> str:
    width, bias, silu, cache, idx, state = c
    return f"W{width}-{'bias' if bias else 'nobias'}-{'silu' if silu else 'linear'}-cache{cache}-idx{idx}-{state}"


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item()


def check_fn(combo: tuple, batch: int, dim: int, seqlen: int, device: str, tol: float) -> None:
    """causal_conv1d_fn's output, final states and gradients against the fp32 reference (on the CPU,
    so no TF32 convolution enters it); an in-place op on the outputs works."""
    width, bias_on, silu, layout, states = combo
    g = torch.Generator().manual_seed(seqlen * 7 + width)
    if layout == "channel_last":
        x = torch.randn(batch, seqlen, dim, generator=g).transpose(1, 2)
    else:
        x = torch.randn(batch, dim, seqlen, generator=g)
    weight = torch.randn(dim, width, generator=g) * width ** -0.5
    bias = torch.randn(dim, generator=g) if bias_on else None
    seq_idx = None
    if states == "seq_idx":
        seq_idx = torch.zeros(batch, seqlen, dtype=torch.int32)
        seq_idx[:, seqlen // 3:] = 1
        seq_idx[-1, 2 * seqlen // 3:] = 2
        seq_idx[0, seqlen - seqlen // 5:] = -1  # padding at the end of row 0 (from seqlen 5 on)
    init = torch.randn(batch, dim, width - 1, generator=g) if states in ("init", "init-final") else None
    final = states in ("init-final", "final")
    activation = "silu" if silu else None
    dout = torch.randn(batch, dim, seqlen, generator=g)
    dfinal = torch.randn(batch, dim, width - 1, generator=g)
    leaves = {"x": x, "weight": weight, "bias": bias, "initial_states": init}
    leaves = {k: v for k, v in leaves.items() if v is not None}

    def run(fn, where: str) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        req = {k: v.detach().to(where).requires_grad_() for k, v in leaves.items()}
        s = None if seq_idx is None else seq_idx.to(where)
        with torch.enable_grad():
            out, fin = fn(req, s)
            loss = (out * dout.to(where)).sum()
            if final:
                loss = loss + (fin * dfinal.to(where)).sum()
            grads = torch.autograd.grad(loss, list(req.values()))
        return out.detach(), None if fin is None else fin.detach(), dict(zip(req, grads, strict=True))

    def ours(req: dict[str, torch.Tensor], s: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        res = causal_conv1d_fn(req["x"], req["weight"], req.get("bias"), s, req.get("initial_states"),
                               return_final_states=final, activation=activation)
        return res if final else (res, None)

    def ref(req: dict[str, torch.Tensor], s: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        out, fin = causal_conv1d_ref(req["x"], req["weight"], req.get("bias"), s, req.get("initial_states"),
                                     activation)
        return out, fin if final else None

    out, fin, grads = run(ours, device)
    ref_out, ref_fin, ref_grads = run(ref, "cpu")
    assert out.stride() == x.stride(), "the output keeps x's layout"
    scale = 1 + ref_out.abs().max().item()
    assert _err(out.cpu(), ref_out) <= tol * scale, f"out: {_err(out.cpu(), ref_out):.2e}"
    if final:
        assert torch.equal(fin.cpu(), ref_fin), "final states"
    for name, grad in grads.items():
        want = ref_grads[name]
        assert grad.shape == want.shape, name
        assert _err(grad.cpu(), want) <= tol * (1 + want.abs().max().item()), f"{name}: {_err(grad.cpu(), want):.2e}"
    if final:
        # Independent outputs, as causal-conv1d's: an in-place op on either is allowed.
        out2, fin2 = causal_conv1d_fn(x.to(device).requires_grad_(), weight.to(device), None if bias is None else
                                      bias.to(device), None, None if init is None else init.to(device),
                                      return_final_states=True, activation=activation)
        out2 += 1
        fin2 += 1


def check_update(combo: tuple, batch: int, dim: int, seqlen: int, device: str, tol: float) -> None:
    """causal_conv1d_update's output and updated state against the fp32 reference loop."""
    width, bias_on, silu, cache, idx, state = combo
    g = torch.Generator().manual_seed(seqlen * 5 + width)
    state_len = width - 1 if state == "short" else width + 3
    nstates = batch + 2 if idx else batch
    x = torch.randn(batch, dim, seqlen, generator=g)
    conv_state = torch.randn(nstates, dim, state_len, generator=g)
    weight = torch.randn(dim, width, generator=g) * width ** -0.5
    bias = torch.randn(dim, generator=g) if bias_on else None
    cache_seqlens = torch.randint(0, 3 * state_len, (batch,), generator=g, dtype=torch.int32) if cache else None
    indices = None
    if idx:
        indices = torch.randperm(nstates, generator=g)[:batch].to(torch.int32)
        indices[-1] = -1  # a padding slot: output 0, no state touched
    activation = "silu" if silu else None
    x_in = x[:, :, 0] if seqlen == 1 else x  # (batch, dim) for one position, as mamba-ssm's step calls it
    ref_state = conv_state.clone()
    want = causal_conv1d_update_ref(x_in, ref_state, weight, bias, activation, cache_seqlens, indices)
    state_dev = conv_state.to(device)
    got = causal_conv1d_update(x_in.to(device), state_dev, weight.to(device), None if bias is None else bias.to(device),
                               activation, None if cache_seqlens is None else cache_seqlens.to(device),
                               None if indices is None else indices.to(device))
    assert got.shape == want.shape
    assert _err(got.cpu(), want) <= tol * (1 + want.abs().max().item()), f"out: {_err(got.cpu(), want):.2e}"
    assert torch.equal(state_dev.cpu(), ref_state), "the updated state"


@pytest.mark.usefixtures("conv_ref_mode")
@pytest.mark.parametrize("combo", FN_COMBOS, ids=[_fn_id(c) for c in FN_COMBOS])
def test_fn_every_option_in_ref_mode(combo: tuple, nan_empty: None) -> None:
    check_fn(combo, 2, 5, length_of(FN_COMBOS, combo, CPU_SEQLENS), "cpu", 1e-5)


@pytest.mark.usefixtures("conv_ref_mode")
@pytest.mark.parametrize("combo", UPDATE_COMBOS, ids=[_update_id(c) for c in UPDATE_COMBOS])
def test_update_every_option_in_ref_mode(combo: tuple, nan_empty: None) -> None:
    check_update(combo, 3, 5, length_of(UPDATE_COMBOS, combo, CPU_SEQLENS), "cpu", 1e-5)


@pytest.mark.parametrize("combos", [FN_COMBOS, UPDATE_COMBOS], ids=["fn", "update"])
@pytest.mark.parametrize("lengths", [SEQLENS, CPU_SEQLENS], ids=["gpu", "cpu"])
def test_every_option_meets_every_length(combos: list[tuple], lengths: tuple[int, ...]) -> None:
    for option in range(len(combos[0])):
        met = {(c[option], length_of(combos, c, lengths)) for c in combos}
        assert met == {(c[option], n) for c in combos for n in lengths}, option


@pytest.mark.usefixtures("conv_ref_mode")
@pytest.mark.parametrize("layout", ["contiguous", "channel_last"])
def test_outputs_with_final_states_take_in_place_ops(layout: str) -> None:
    """causal-conv1d's suite adds to the returned output in place; a view among the autograd
    Function's outputs made that raise ("Output 0 of CausalConv1dFnBackward is a view")."""
    x = torch.randn(2, 7, 6) if layout == "contiguous" else torch.randn(2, 6, 7).transpose(1, 2)
    x.requires_grad_()
    weight = torch.randn(7, 4, requires_grad=True)
    out, final = causal_conv1d_fn(x, weight, return_final_states=True, activation="silu")
    assert out._base is None and final._base is None
    out += 1
    final *= 2
    (out.sum() + final.sum()).backward()
    want_out, _ = causal_conv1d_ref(x.detach(), weight.detach(), activation="silu")
    assert _err(out.detach() - 1, want_out) < 1e-5
    assert x.grad is not None and weight.grad is not None


@pytest.mark.parametrize("combo", FN_COMBOS, ids=[_fn_id(c) for c in FN_COMBOS])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fn_every_option_on_the_gpu(combo: tuple) -> None:
    check_fn(combo, 2, 64, length_of(FN_COMBOS, combo, SEQLENS), "cuda", 1e-4)


# causal-conv1d's failing case, at its own length: dim 64, seqlen 16, width 2, no bias, SiLU, fp32,
# channel-last, initial states (the dx kernel's dinitial_states store did not compile at width 2).
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fn_causal_conv1d_failing_case_on_the_gpu() -> None:
    check_fn((2, 0, 1, "channel_last", "init"), 2, 64, 16, "cuda", 1e-4)


@pytest.mark.parametrize("combo", UPDATE_COMBOS, ids=[_update_id(c) for c in UPDATE_COMBOS])
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_update_every_option_on_the_gpu(combo: tuple) -> None:
    check_update(combo, 3, 64, length_of(UPDATE_COMBOS, combo, SEQLENS), "cuda", 1e-4)
