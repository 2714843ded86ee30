"""The SSD backward and the gated norm's backward writing their gradients into given buffers
(the fused layer's slices of its gradient buffers, mamba-ssm's `dx=, ddt=, dB=, dC=, dz=`): the
same bits as into their own buffers, in the given memory, at any row stride (the SSD's in ref mode on
the CPU; the norm's where it runs)."""

from __future__ import annotations

import pytest
import torch

from autotune_cli.tuning.ssd.inputs import SSDInputs
from mamba_tune.keys import bwd_partials, dbdc_head_runs
from mamba_tune.norm import gated
from mamba_tune.ssd import chunk_state_scan_bwd_dbdc
from mamba_tune.ssd.combined import ssd_backward

pytestmark = pytest.mark.usefixtures("ssd_ref_mode", "nan_empty")

# batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size: two heads per group (the dB/dC
# kernel splits them into runs and sums fp32 partials) or one (one run, written in place).
SHAPE = (2, 40, 4, 8, 2, 16, 16)
ONE_RUN = (2, 40, 4, 8, 4, 16, 16)
OPTIONS = [
    pytest.param({"has_z": 0, "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}, ONE_RUN, "one", id="one-run"),
    pytest.param({"has_z": 1, "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1, "has_seq_idx": 1,
                  "has_initial_states": 1}, SHAPE, "one", id="z-seq_idx-init-head-runs"),
    pytest.param({"has_z": 0, "has_D": 0, "dt_softplus": 1}, SHAPE, "two", id="two-pass-dbdc"),
]


def _inputs(flags: dict[str, int], dtype: torch.dtype, shape: tuple[int, ...] = SHAPE) -> SSDInputs:
    b, L, H, P, G, N, Q = shape
    dims = {"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, "chunk_size": Q,
            **bwd_partials(P, N), "runs": dbdc_head_runs(b, -(-L // Q), G, H), **flags}
    return SSDInputs.make(dims, dtype, "cpu", 3, dt_limit=(0.001, 0.5))


def _slices(i: SSDInputs) -> dict[str, torch.Tensor]:
    """dx, dB, dC as column slices of one (batch, seqlen, dim + 2 ngroups dstate) buffer, ddt and
    dz of another wider one: last stride 1, row strides of the wider buffers."""
    b, L, H, P = i.x.shape
    G, N = i.B.shape[2:]
    xbc = torch.full((b, L, H * P + 2 * G * N), float("nan"), dtype=i.x.dtype)
    dx, dB, dC = torch.split(xbc, [H * P, G * N, G * N], dim=-1)
    wide = torch.full((b, L, H * P + H + 3), float("nan"), dtype=i.x.dtype)
    dz = wide[..., :H * P]
    ddt = torch.full((b, L, H + 5), float("nan"), dtype=i.dt.dtype)[..., 2:H + 2]
    out = {"x": dx.unflatten(-1, (H, P)), "B": dB.unflatten(-1, (G, N)), "C": dC.unflatten(-1, (G, N)), "dt": ddt}
    if i.z is not None:
        out["z"] = dz.unflatten(-1, (H, P))
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("flags,shape,dbdc", OPTIONS)
def test_gradients_written_into_given_slices_are_the_same_bits(flags, shape, dbdc, dtype, monkeypatch):
    monkeypatch.setenv("MAMBA_TUNE_SSD_DBDC", dbdc)
    b, L, H, _P, G, _N, Q = shape
    assert (chunk_state_scan_bwd_dbdc.head_splits(b, -(-L // Q), G, H) == 1) == (shape == ONE_RUN)
    i = _inputs(flags, dtype, shape)
    gen = torch.Generator().manual_seed(1)
    dy = torch.randn(*i.x.shape, generator=gen).to(i.x.dtype)
    kw = {k: v for k, v in i.kwargs().items() if k not in ("return_final_states",)}
    own = ssd_backward(dy, None, i.x, i.dt, i.A, i.B, i.C, i.chunk_size, **kw)
    outs = _slices(i)
    given = ssd_backward(dy, None, i.x, i.dt, i.A, i.B, i.C, i.chunk_size, **kw,
                         **{f"d{k}": v for k, v in outs.items()})
    for name, g in own.items():
        if g is None:
            assert given[name] is None, name
            continue
        assert torch.equal(given[name], g), f"d{name}: not the same bits in the given buffer"
        if name in outs:
            assert given[name].data_ptr() == outs[name].data_ptr(), f"d{name}: not written in place"
            assert torch.equal(outs[name], g), f"d{name}: the given buffer does not hold the gradient"


def test_bad_buffers_are_value_errors():
    i = _inputs({"has_z": 0, "dt_softplus": 1}, torch.bfloat16)
    dy = torch.zeros_like(i.x)
    kw = {k: v for k, v in i.kwargs().items() if k not in ("return_final_states",)}
    b, L, H, P = i.x.shape
    cases = [
        ({"dx": torch.empty(b, L, H, P + 1, dtype=i.x.dtype)}, r"dx must be \(2, 40, 4, 8\)"),
        ({"dx": torch.empty(b, L, P, H, dtype=i.x.dtype).transpose(2, 3)}, "with a unit last stride"),
        ({"ddt": torch.empty(b, L, H, dtype=torch.float16)}, "ddt must be"),
        ({"dB": torch.empty_like(i.B)}, "dB and dC are given together"),
        ({"dz": torch.empty_like(i.x)}, "dz given without its input"),
    ]
    for out, match in cases:
        with pytest.raises(ValueError, match=match):
            ssd_backward(dy, None, i.x, i.dt, i.A, i.B, i.C, i.chunk_size, **kw, **out)


@pytest.mark.parametrize("norm_before_gate", [False, True], ids=["norm-after-gate", "norm-before-gate"])
def test_the_norms_dz_written_into_a_given_slice_is_the_same_bits(norm_before_gate):
    # Where the norm runs: compiled on a GPU, in ref mode on a CPU (tests/conftest.py).
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(0)
    rows, d, gs = 40, 32, 16
    y, dy = (torch.randn(rows, d, generator=gen, device=dev).to(torch.bfloat16) for _ in range(2))
    zxbcdt = torch.randn(rows, 3 * d, generator=gen, device=dev).to(torch.bfloat16)
    z = zxbcdt[:, d:2 * d]  # a column slice, as the fused layer passes z
    w = (1 + 0.1 * torch.randn(d, generator=gen, device=dev)).to(torch.bfloat16)
    _out, _mean, rstd = gated._fwd(y, z, w, None, 1e-5, gs, norm_before_gate, True)
    own = gated._bwd(dy, y, z, w, None, None, rstd, gs, norm_before_gate, True)
    grad = torch.full_like(zxbcdt, float("nan"))
    dz = grad[:, d:2 * d]
    given = gated._bwd(dy, y, z, w, None, None, rstd, gs, norm_before_gate, True, dz2=dz)
    assert torch.equal(given[0], own[0]) and torch.equal(given[2], own[2])
    assert given[1].data_ptr() == dz.data_ptr() and torch.equal(dz, own[1])
    assert grad[:, :d].isnan().all() and grad[:, 2 * d:].isnan().all()  # nothing outside the slice
