"""The conv1d references check each other: torch's F.conv1d form and the per-tap sum."""

from __future__ import annotations

import pytest
import torch

from autotune_cli.reference import causal_conv1d_ref, causal_conv1d_taps_ref


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("with_init", [False, True])
def test_conv1d_form_equals_the_tap_sum(width: int, with_init: bool) -> None:
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(2, 5, 17, generator=gen)
    weight, bias = torch.randn(5, width, generator=gen), torch.randn(5, generator=gen)
    init = torch.randn(2, 5, width - 1, generator=gen) if with_init else None
    out, final = causal_conv1d_ref(x, weight, bias, initial_states=init, activation="silu")
    taps = causal_conv1d_taps_ref(x, weight, bias, initial_states=init, activation="silu")
    assert (out - taps).abs().max().item() < 1e-5
    # One sequence everywhere: seq_idx changes nothing (the tap form runs).
    zeros = torch.zeros(2, 17, dtype=torch.int32)
    if not with_init:
        assert (causal_conv1d_ref(x, weight, bias, zeros, activation="silu")[0] - out).abs().max().item() < 1e-5
    expected_final = x[:, :, -(width - 1):]
    assert torch.equal(final, expected_final)


def test_final_states_of_a_short_sequence_include_the_initial_states() -> None:
    x = torch.arange(2.0).view(1, 1, 2)
    init = torch.tensor([[[10.0, 11.0, 12.0]]])
    _, final = causal_conv1d_ref(x, torch.ones(1, 4), initial_states=init)
    assert final.tolist() == [[[12.0, 0.0, 1.0]]]


def test_low_precision_form_stays_in_the_dtype() -> None:
    x = torch.randn(1, 3, 8).bfloat16()
    w = torch.randn(3, 4).bfloat16()
    out, _ = causal_conv1d_ref(x, w, upcast=False)
    assert out.dtype == torch.bfloat16
    assert (out.float() - causal_conv1d_ref(x, w)[0].float()).abs().max().item() < 0.1
