"""The conv1d decode step (`causal_conv1d_update`) in Helion ref mode against the reference.

Outputs and the in-place state update for (batch, dim) and (batch, dim, seqlen) inputs,
state_len = width - 1, width and longer, the circular buffer of cache_seqlens (wrapping,
and steps longer than the state), conv_state_indices with padding slots, and errors.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from autotune_cli.reference import causal_conv1d_ref, causal_conv1d_update_ref
from mamba_tune.conv1d import causal_conv1d_update

pytestmark = pytest.mark.usefixtures("conv_ref_mode")


def _inputs(batch: int, dim: int, seqlen: int, width: int, state_len: int, nslots: int, dtype: torch.dtype,
            seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, dim, seqlen, generator=gen).to(dtype)
    state = torch.randn(nslots, dim, state_len, generator=gen).to(dtype)
    weight = (torch.randn(dim, width, generator=gen) * width ** -0.5).to(dtype)
    bias = torch.randn(dim, generator=gen).to(dtype)
    return x, state, weight, bias


CASES = [
    # (seqlen, width, state_len)
    (1, 4, 3),
    (1, 4, 4),
    (1, 2, 6),
    (3, 3, 5),
    (5, 4, 3),  # a step longer than the state
    (2, 4, 9),
]


@pytest.mark.parametrize(("seqlen", "width", "state_len"), CASES, ids=[f"L{a}-W{b}-S{c}" for a, b, c in CASES])
@pytest.mark.parametrize("mode", ["shift", "circular", "indices", "circular-indices"])
def test_update_matches_the_reference(seqlen: int, width: int, state_len: int, mode: str, nan_empty: None) -> None:
    batch, dim = 3, 6
    with_indices = "indices" in mode
    nslots = batch + 2 if with_indices else batch
    x, state, weight, bias = _inputs(batch, dim, seqlen, width, state_len, nslots, torch.float32)
    cache_seqlens = torch.tensor([0, 7, state_len - 1], dtype=torch.int32) if "circular" in mode else None
    indices = torch.tensor([4, -1, 1], dtype=torch.int32) if with_indices else None
    for activation in (None, "silu"):
        ours, theirs = state.clone(), state.clone()
        out = causal_conv1d_update(x, ours, weight, bias, activation, cache_seqlens, indices)
        ref = causal_conv1d_update_ref(x, theirs, weight, bias, activation, cache_seqlens, indices)
        assert out.shape == x.shape
        assert (out - ref).abs().max().item() < 1e-5
        assert torch.equal(ours, theirs), "conv_state updated differently"
        if with_indices:
            assert torch.all(out[1] == 0)  # the padding slot
            untouched = [s for s in range(nslots) if s not in (4, 1)]
            assert torch.equal(ours[untouched], state[untouched])


def test_two_dimensional_x_and_no_bias() -> None:
    x, state, weight, _ = _inputs(2, 5, 1, 4, 4, 2, torch.float32)
    ours, theirs = state.clone(), state.clone()
    out = causal_conv1d_update(x[:, :, 0], ours, weight, None, "swish")
    ref = causal_conv1d_update_ref(x[:, :, 0], theirs, weight, None, "swish")
    assert out.shape == (2, 5) and (out - ref).abs().max().item() < 1e-5 and torch.equal(ours, theirs)


def test_decode_continues_the_full_sequence_conv() -> None:
    # Prefill states + token-by-token decode == the conv over the whole sequence
    # (independent of the update reference), for the shifting and the circular state.
    width, dim, total, prefill = 4, 6, 11, 5
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, dim, total, generator=gen)
    weight, bias = torch.randn(dim, width, generator=gen), torch.randn(dim, generator=gen)
    full, _ = causal_conv1d_ref(x, weight, bias, activation="silu")
    _, final = causal_conv1d_ref(x[:, :, :prefill], weight, bias, activation="silu")
    shift_state = final.clone()
    circ_state = torch.zeros(2, dim, 8)
    circ_state[:, :, prefill - (width - 1):prefill] = final
    for t in range(prefill, total):
        out = causal_conv1d_update(x[:, :, t], shift_state, weight, bias, "silu")
        assert (out - full[:, :, t]).abs().max().item() < 1e-5
        seqlens = torch.full((2,), t, dtype=torch.int32)
        out = causal_conv1d_update(x[:, :, t], circ_state, weight, bias, "silu", cache_seqlens=seqlens)
        assert (out - full[:, :, t]).abs().max().item() < 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision(dtype: torch.dtype) -> None:
    x, state, weight, bias = _inputs(2, 8, 2, 4, 4, 2, dtype)
    ours, theirs = state.clone(), state.clone()
    out = causal_conv1d_update(x, ours, weight, bias, "silu")
    ref = causal_conv1d_update_ref(x, theirs, weight, bias, "silu")
    assert out.dtype == dtype and torch.equal(ours, theirs)
    assert (out.float() - ref.float()).abs().max().item() <= 2 * torch.finfo(dtype).eps * max(1.0, ref.abs().max())


def _bad_calls() -> list[tuple[str, dict, str]]:
    x, state, weight, _ = _inputs(2, 6, 1, 4, 4, 2, torch.float32)
    i32 = torch.int32
    return [
        ("x-4d", dict(x=x[None], conv_state=state, weight=weight), r"x must be \(batch, dim\)"),
        ("state-short", dict(x=x, conv_state=state[:, :, :2], weight=weight), "state_len >= width - 1 = 3"),
        ("state-dim", dict(x=x, conv_state=state[:, :5], weight=weight), "conv_state must be"),
        ("state-batch", dict(x=x, conv_state=state[:1], weight=weight), "conv_state batch 1 != x batch 2"),
        ("width", dict(x=x, conv_state=state, weight=torch.randn(6, 5)), "width 5"),
        ("cache-shape", dict(x=x, conv_state=state, weight=weight, cache_seqlens=torch.zeros(3, dtype=i32)),
         r"cache_seqlens shape \(3,\)"),
        ("cache-float", dict(x=x, conv_state=state, weight=weight, cache_seqlens=torch.zeros(2)), "cache_seqlens dtype"),
        ("indices-shape", dict(x=x, conv_state=state, weight=weight, conv_state_indices=torch.zeros(1, dtype=i32)),
         "conv_state_indices shape"),
        ("activation", dict(x=x, conv_state=state, weight=weight, activation="gelu"), "activation 'gelu'"),
    ]


@pytest.mark.parametrize(("kwargs", "match"), [c[1:] for c in _bad_calls()], ids=[c[0] for c in _bad_calls()])
def test_bad_input_is_a_value_error(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        causal_conv1d_update(**kwargs)


def test_runtime_dims() -> None:
    from mamba_tune.conv1d import update

    x, state, weight, bias = _inputs(2, 6, 3, 4, 5, 4, torch.float32)
    for cs, idx in itertools.product((None, torch.zeros(2, dtype=torch.int32)), repeat=2):
        dims = update._dims_from_args((x, state, weight, bias, cs, idx, torch.empty_like(x), 4, True))
        assert tuple(dims) == update.CAUSAL_CONV1D_UPDATE.dims
        assert (dims["state_len"], dims["has_cache_seqlens"], dims["has_state_indices"]) == (
            5, int(cs is not None), int(idx is not None))
