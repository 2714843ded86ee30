"""The two SSD reference levels check each other (plain PyTorch, fp32, CPU).

The chunked einsum form (autotune_cli.reference.ssd_chunked_ref, stage by stage) against the
token-by-token recurrence (ssd_recurrent_ref), over every option of
mamba_chunk_scan_combined; plus properties of single stages that the kernels rely on.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.reference import (
    bmm_chunk_ref,
    chunk_cumsum_ref,
    chunk_state_ref,
    ssd_chunked_ref,
    ssd_recurrent_ref,
    state_passing_ref,
)
from autotune_cli.tuning.ssd.inputs import SSDInputs
from mamba_tune.ssd.bmm import mask_other_sequences

# (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size)
SHAPES = [
    pytest.param(2, 100, 4, 8, 2, 16, 16, id="L100-Q16-G2"),
    pytest.param(1, 64, 1, 5, 1, 7, 16, id="H1-G1-L64"),
    pytest.param(2, 37, 6, 4, 3, 8, 32, id="L37-Q32-G3"),
]
OPTIONS = [
    pytest.param({}, id="plain"),
    pytest.param({"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1}, id="mixer"),
    pytest.param({"has_D": 1, "has_z": 1, "D_per_head": False}, id="Dhp-z"),
    pytest.param({"has_dt_bias": 1, "dt_softplus": 1, "dt_limit": (0.004, 0.05)}, id="dt_limit"),
    pytest.param({"has_initial_states": 1}, id="init"),
    pytest.param({"has_seq_idx": 1}, id="seq_idx"),
    pytest.param({"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1}, id="seq_idx-init-z-D"),
]


def _inputs(shape: tuple[int, ...], options: dict, dtype: torch.dtype = torch.float32, seed: int = 0) -> SSDInputs:
    b, L, H, P, G, N, Q = shape
    dims = {"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, "chunk_size": Q,
            **{k: v for k, v in options.items() if k not in ("dt_limit", "D_per_head")}}
    return SSDInputs.make(dims, dtype, "cpu", seed, dt_limit=options.get("dt_limit", (0.0, float("inf"))),
                          D_per_head=options.get("D_per_head", True))


@pytest.mark.parametrize("b,L,H,P,G,N,Q", SHAPES)
@pytest.mark.parametrize("options", OPTIONS)
def test_chunked_matches_recurrence(b, L, H, P, G, N, Q, options):
    i = _inputs((b, L, H, P, G, N, Q), options)
    out_c, final_c = ssd_chunked_ref(i.x, i.dt, i.A, i.B, i.C, Q, **i.kwargs())
    out_r, final_r = ssd_recurrent_ref(i.x, i.dt, i.A, i.B, i.C, **i.kwargs())
    scale = out_r.abs().max().item()
    torch.testing.assert_close(out_c, out_r, atol=1e-5 * max(scale, 1.0), rtol=1e-5)
    torch.testing.assert_close(final_c, final_r, atol=1e-5, rtol=1e-5)


def test_seq_idx_resets_state_like_separate_sequences():
    # Two packed sequences give the outputs of two separate calls (the second from zero state).
    i = _inputs((1, 70, 2, 4, 1, 8, 16), {"has_D": 1})
    seq_idx = torch.zeros(1, 70, dtype=torch.int32)
    seq_idx[:, 29:] = 1
    packed, final = ssd_chunked_ref(i.x, i.dt, i.A, i.B, i.C, 16, D=i.D, seq_idx=seq_idx)
    first, _ = ssd_chunked_ref(i.x[:, :29], i.dt[:, :29], i.A, i.B[:, :29], i.C[:, :29], 16, D=i.D)
    second, final2 = ssd_chunked_ref(i.x[:, 29:], i.dt[:, 29:], i.A, i.B[:, 29:], i.C[:, 29:], 16, D=i.D)
    torch.testing.assert_close(packed, torch.cat([first, second], dim=1), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, final2, atol=1e-5, rtol=1e-5)


def test_initial_states_continue_a_split_sequence():
    # Running the second half from the first half's final state gives the whole sequence's output.
    i = _inputs((2, 96, 3, 4, 1, 8, 32), {"has_dt_bias": 1, "dt_softplus": 1})
    kw = {"dt_bias": i.dt_bias, "dt_softplus": True}
    whole, final = ssd_chunked_ref(i.x, i.dt, i.A, i.B, i.C, 32, **kw)
    _, mid = ssd_chunked_ref(i.x[:, :40], i.dt[:, :40], i.A, i.B[:, :40], i.C[:, :40], 32, **kw)
    rest, final2 = ssd_chunked_ref(i.x[:, 40:], i.dt[:, 40:], i.A, i.B[:, 40:], i.C[:, 40:], 32,
                                   initial_states=mid, **kw)
    torch.testing.assert_close(rest, whole[:, 40:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final2, final, atol=1e-5, rtol=1e-5)


def test_chunk_cumsum_pads_with_zero_dt():
    i = _inputs((2, 50, 3, 4, 1, 8, 16), {"has_dt_bias": 1, "dt_softplus": 1})
    dA, dt_out = chunk_cumsum_ref(i.dt, i.A, 16, i.dt_bias, True)
    assert dA.shape == dt_out.shape == (2, 3, 4, 16)
    flat = dt_out.flatten(2)
    assert torch.all(flat[..., 50:] == 0)
    assert torch.all(flat[..., :50] > 0)
    # The last entry of each chunk is the chunk's total dt * A (what F2 and F3 read).
    torch.testing.assert_close(dA[..., -1], (dt_out * i.A[:, None, None]).sum(-1))


def test_state_passing_ref_is_the_chunk_recurrence():
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(2, 5, 3, 4, 6, generator=gen)
    dA_last = -torch.rand(2, 3, 5, generator=gen)
    init = torch.randn(2, 3, 4, 6, generator=gen)
    prev, final = state_passing_ref(states, dA_last, init)
    torch.testing.assert_close(prev[:, 0], init)
    for c in range(1, 5):
        expected = torch.exp(dA_last[:, :, c - 1])[..., None, None] * prev[:, c - 1] + states[:, c - 1]
        torch.testing.assert_close(prev[:, c], expected)
    torch.testing.assert_close(final, torch.exp(dA_last[:, :, 4])[..., None, None] * prev[:, 4] + states[:, 4])


def test_bmm_ref_masks_padding_and_sequences():
    i = _inputs((1, 40, 2, 4, 2, 8, 16), {"has_seq_idx": 1})
    cb = bmm_chunk_ref(i.C, i.B, 16, i.seq_idx)
    assert cb.shape == (1, 3, 2, 16, 16)
    assert torch.all(cb[:, 2, :, 8:, :] == 0) and torch.all(cb[:, 2, :, :, 8:] == 0)
    seq = torch.nn.functional.pad(i.seq_idx, (0, 8), value=-1).view(1, 3, 16)
    cross = seq[..., :, None] != seq[..., None, :]
    assert torch.all(cb.permute(0, 1, 3, 4, 2)[cross] == 0)


def test_masking_maskless_cb_afterwards_equals_the_masked_cb():
    # F4 on the GPU: the maskless kernel, then mask_other_sequences (bmm.py). Seqlen 40 is
    # not a multiple of 16, and the random boundaries fall inside chunks.
    for seed in range(3):
        i = SSDInputs.make({"batch": 2, "seqlen": 40, "nheads": 2, "headdim": 4, "ngroups": 2, "dstate": 8,
                            "chunk_size": 16, "has_seq_idx": 1}, torch.float32, "cpu", seed)
        assert (i.seq_idx[:, 1:] != i.seq_idx[:, :-1]).any()
        masked = mask_other_sequences(bmm_chunk_ref(i.C, i.B, 16, None), i.seq_idx, 16)
        torch.testing.assert_close(masked, bmm_chunk_ref(i.C, i.B, 16, i.seq_idx), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_reference_is_low_precision_but_close(dtype):
    # The error bound of the kernel tests: nonzero (so it bounds something) and small.
    i = _inputs((2, 100, 4, 8, 2, 16, 32), {"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1}, dtype=dtype)
    u = i.upcast()
    ref, _ = ssd_chunked_ref(u.x, u.dt, u.A, u.B, u.C, 32, **u.kwargs())
    low, _ = ssd_chunked_ref(i.x, i.dt, i.A, i.B, i.C, 32, upcast=False, **i.kwargs())
    err = (low.float() - ref).abs().max().item()
    assert 0 < err < 0.05 * ref.abs().max().item()
    states = chunk_state_ref(i.B, i.x, *reversed(chunk_cumsum_ref(i.dt, i.A, 32, i.dt_bias, True)), upcast=False)
    assert states.dtype == torch.float32
