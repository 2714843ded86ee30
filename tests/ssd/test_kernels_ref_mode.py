"""SSD kernels in Helion ref mode on CPU: each stage and the combined forward against the fp32 references.

Ref mode runs the kernel bodies eagerly (see conftest.py), so this checks the kernels'
math, masking and option handling on any machine; that each kernel also compiles is
test_lowering.py's job, and the real-size GPU runs are in test_gpu.py.

Bound: err(kernel) <= 2 * err(eager torch in the same dtype) + atol, max-abs errors
against fp32, with atol per dtype. Outputs allocated with torch.empty start as NaN. Block
sizes are the smallest each kernel allows unless a test says otherwise (conftest.py), so
every loop runs several tiles and every edge mask is hit.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.reference import (
    bmm_chunk_ref,
    chunk_cumsum_ref,
    chunk_scan_ref,
    chunk_state_ref,
    ssd_chunked_ref,
    ssd_recurrent_ref,
    state_passing_ref,
)
from autotune_cli.tuning import get
from autotune_cli.tuning.ssd.inputs import SSDInputs
from mamba_tune import runtime
from mamba_tune.ssd import (
    bmm_chunk_fwd,
    chunk_cumsum_fwd,
    chunk_scan_fwd,
    chunk_state_fwd,
    chunk_state_passing_fwd,
    mamba_chunk_scan_combined,
    ssd_forward,
)

pytestmark = pytest.mark.usefixtures("ssd_ref_mode", "nan_empty")

# (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size)
SHAPES = [
    pytest.param((2, 80, 4, 24, 2, 24, 32), id="L80-Q32-G2-P24-N24"),  # seqlen % chunk_size != 0
    pytest.param((1, 64, 1, 16, 1, 16, 16), id="H1-G1-L64-Q16"),  # one head, exact chunks
    pytest.param((2, 37, 6, 20, 3, 24, 16), id="L37-Q16-G3-P20-N24"),  # odd sizes, 3 groups
]
STAGES = ["ssd_chunk_cumsum", "ssd_chunk_state", "ssd_chunk_state_passing", "ssd_bmm",
          "ssd_chunk_scan"]
FLAG_SETS = [
    pytest.param(0, id="flags-off"),
    pytest.param(1, id="flags-on"),
]


def _dims(shape: tuple[int, ...], **flags: int) -> dict[str, int]:
    b, L, H, P, G, N, Q = shape
    return {"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, "chunk_size": Q, **flags}


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _assert_bounded(name: str, out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, atol: float) -> None:
    assert not out.isnan().any(), f"{name}: NaN in the output (an unwritten tile?)"
    err, bound = _max_err(out, ref), 2 * _max_err(low, ref) + atol
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * eager-{low.dtype} error + atol = {bound:.3e}"


# --- each stage through its tuning record (the tuner's own accuracy check) ------------


# (dtype, atol, block sizes): fp16 runs in the combined tests; Helion's own ref-mode
# block sizes (one tile per loop) once, in bf16.
STAGE_RUNS = [
    pytest.param(torch.float32, 1e-4, "min", id="fp32-min-blocks"),
    pytest.param(torch.bfloat16, 1e-2, "min", id="bf16-min-blocks"),
    pytest.param(torch.bfloat16, 1e-2, "max", id="bf16-max-blocks"),
]


@pytest.mark.parametrize("dtype,atol,ssd_ref_mode", STAGE_RUNS, indirect=["ssd_ref_mode"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("flags", FLAG_SETS)
@pytest.mark.parametrize("stage", STAGES)
def test_stage_matches_reference(stage, flags, shape, dtype, atol, ssd_ref_mode):
    tk = get(stage)
    all_flags = {"has_dt_bias": flags, "dt_softplus": flags, "has_D": flags, "has_z": flags,
                 "has_seq_idx": flags, "has_initial_states": flags}
    dims = {k: v for k, v in _dims(shape, **all_flags).items() if k in tk.dims}
    problem = tk.make_problem(dims, dtype, torch.device("cpu"), 0)
    outputs = problem.outputs(problem.run(lambda *args: runtime.run(tk.runtime, args)))
    ref, low = problem.reference(), problem.lowp_reference()
    assert outputs.keys() == ref.keys() == low.keys()
    for name in ref:
        _assert_bounded(f"{stage}.{name}", outputs[name], ref[name], low[name], atol)


# --- the public stage functions -------------------------------------------------------


def test_stage_functions_chain_to_the_reference():
    i = SSDInputs.make(_dims((2, 100, 4, 24, 2, 40, 32), has_dt_bias=1, dt_softplus=1, has_D=1,
                             has_initial_states=1, has_seq_idx=1), torch.float32, "cpu", 1)
    dA, dt_out = chunk_cumsum_fwd(i.dt, i.A, 32, i.dt_bias, True)
    rdA, rdt = chunk_cumsum_ref(i.dt, i.A, 32, i.dt_bias, True)
    torch.testing.assert_close(dA, rdA, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dt_out, rdt)
    states = chunk_state_fwd(i.B, i.x, dt_out, dA, i.seq_idx)
    torch.testing.assert_close(states, chunk_state_ref(i.B, i.x, rdt, rdA, i.seq_idx), atol=1e-4, rtol=1e-4)
    rprev, rfinal = state_passing_ref(states, dA[..., -1], i.initial_states, i.seq_idx, 32)
    prev, final = chunk_state_passing_fwd(i.B, i.x, dt_out, dA, i.initial_states, i.seq_idx)
    torch.testing.assert_close(prev, rprev, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(final, rfinal, atol=1e-4, rtol=1e-4)
    cb = bmm_chunk_fwd(i.C, i.B, 32, i.seq_idx)
    torch.testing.assert_close(cb, bmm_chunk_ref(i.C, i.B, 32, i.seq_idx), atol=1e-4, rtol=1e-4)
    out = chunk_scan_fwd(i.x, dt_out, dA, i.C, prev, CB=cb, D=i.D, seq_idx=i.seq_idx)
    ref = chunk_scan_ref(cb, i.x, rdt, rdA, i.C, rprev, i.D, None, i.seq_idx)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


# --- the combined forward against the recurrence --------------------------------------

OPTIONS = [
    pytest.param({"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1}, id="mixer"),  # the Mamba-2 layer's call
    pytest.param({}, id="plain"),
    pytest.param({"has_D": 1, "has_z": 1, "D_per_head": False}, id="Dhp-z"),
    pytest.param({"has_dt_bias": 1, "dt_softplus": 1, "dt_limit": (0.004, 0.05)}, id="dt_limit"),
    pytest.param({"has_initial_states": 1, "has_dt_bias": 1}, id="init-bias"),
    pytest.param({"has_seq_idx": 1, "dt_softplus": 1}, id="seq_idx"),
    pytest.param({"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1}, id="seq_idx-init-z-D"),
]


def _combined_inputs(shape, options, dtype, seed=0) -> SSDInputs:
    dims = _dims(shape, **{k: v for k, v in options.items() if k not in ("dt_limit", "D_per_head")})
    return SSDInputs.make(dims, dtype, "cpu", seed, dt_limit=options.get("dt_limit", (0.0, float("inf"))),
                          D_per_head=options.get("D_per_head", True))


def _check_combined(i: SSDInputs, atol: float) -> None:
    out, final = ssd_forward(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, **i.kwargs())
    assert out.shape == i.x.shape and out.dtype == i.x.dtype
    b, _, H, P = i.x.shape
    assert final.shape == (b, H, P, i.B.shape[3]) and final.dtype == torch.float32
    u = i.upcast()
    ref_out, ref_final = ssd_recurrent_ref(u.x, u.dt, u.A, u.B, u.C, **u.kwargs())
    low_out, low_final = ssd_chunked_ref(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, upcast=False, **i.kwargs())
    _assert_bounded("out", out, ref_out, low_out, atol)
    _assert_bounded("final_states", final, ref_final, low_final, atol)


# Every option at the first shape; the layer's call and the busiest mix at the others.
COMBINED_CASES = [pytest.param(SHAPES[0].values[0], *opt.values, id=f"{SHAPES[0].id}-{opt.id}") for opt in OPTIONS] + [
    pytest.param(shape.values[0], *opt.values, id=f"{shape.id}-{opt.id}")
    for shape in SHAPES[1:] for opt in (OPTIONS[0], OPTIONS[-1])
]


@pytest.mark.parametrize("shape,options", COMBINED_CASES)
def test_combined_bf16_matches_recurrence(shape, options):
    _check_combined(_combined_inputs(shape, options, torch.bfloat16), atol=1e-2)


@pytest.mark.parametrize("dtype,atol", [
    pytest.param(torch.float16, 2e-3, id="fp16"),
    pytest.param(torch.bfloat16, 1e-2, id="bf16"),
    pytest.param(torch.float32, 1e-4, id="fp32"),
])
def test_combined_dtypes(dtype, atol):
    options = {"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    _check_combined(_combined_inputs((2, 80, 4, 24, 2, 24, 32), options, dtype, seed=5), atol)


def test_public_function_returns_final_states_on_request():
    i = _combined_inputs((1, 48, 2, 16, 1, 16, 16), {"has_initial_states": 1}, torch.float32)
    out = mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, 16, initial_states=i.initial_states)
    out2, final = mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, 16, initial_states=i.initial_states,
                                            return_final_states=True)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, out2)
    _, ref_final = ssd_recurrent_ref(i.x, i.dt, i.A, i.B, i.C, initial_states=i.initial_states)
    torch.testing.assert_close(final, ref_final, atol=1e-4, rtol=1e-4)


def test_noncontiguous_inputs():
    # x, B, C as slices of one projection (how the Mamba-2 layer produces them).
    i = _combined_inputs((2, 50, 4, 16, 2, 16, 16), {"has_D": 1}, torch.float32)
    b, L, H, P = i.x.shape
    N = i.B.shape[3]
    proj = torch.randn(b, L, H * P + 2 * 2 * N)
    x = proj[..., : H * P].view(b, L, H, P)
    B = proj[..., H * P : H * P + 2 * N].view(b, L, 2, N)
    C = proj[..., H * P + 2 * N :].view(b, L, 2, N)
    out = mamba_chunk_scan_combined(x, i.dt, i.A, B, C, 16, D=i.D)
    ref, _ = ssd_recurrent_ref(x, i.dt, i.A, B, C, D=i.D)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


# --- the shape contract ---------------------------------------------------------------


def _good():
    i = _combined_inputs((2, 40, 4, 16, 2, 16, 16), {}, torch.float32)
    return {"x": i.x, "dt": i.dt, "A": i.A, "B": i.B, "C": i.C, "chunk_size": 16}


BAD = [
    pytest.param({"x": torch.randn(2, 40, 64)}, r"x must be \(batch, seqlen, nheads, headdim\)", id="x-3d"),
    pytest.param({"dt": torch.randn(2, 41, 4)}, r"dt shape \(2, 41, 4\) != .* \(2, 40, 4\)", id="dt-seqlen"),
    pytest.param({"A": torch.randn(5)}, r"A shape \(5,\) != \(nheads,\) = \(4,\)", id="A-nheads"),
    pytest.param({"B": torch.randn(2, 40, 3, 16), "C": torch.randn(2, 40, 3, 16)}, r"ngroups=3 does not divide nheads=4",
                 id="groups"),
    pytest.param({"C": torch.randn(2, 40, 2, 8)}, r"C shape \(2, 40, 2, 8\) != .* \(2, 40, 2, 16\)", id="C-dstate"),
    pytest.param({"chunk_size": 48}, r"chunk_size=48 must be a power of two", id="chunk-not-pow2"),
    pytest.param({"chunk_size": 8}, r"chunk_size=8 must be a power of two >= 16", id="chunk-small"),
    pytest.param({"D": torch.randn(4, 8)}, r"D shape \(4, 8\) is neither \(nheads,\) = \(4,\) nor .* \(4, 16\)",
                 id="D-shape"),
    pytest.param({"z": torch.randn(2, 40, 4, 8)}, r"z shape \(2, 40, 4, 8\) != .* \(2, 40, 4, 16\)", id="z-shape"),
    pytest.param({"dt_bias": torch.randn(3)}, r"dt_bias shape \(3,\) != \(nheads,\) = \(4,\)", id="dt_bias"),
    pytest.param({"initial_states": torch.randn(2, 4, 16, 8)},
                 r"initial_states shape \(2, 4, 16, 8\) != .* \(2, 4, 16, 16\)", id="init-shape"),
    pytest.param({"seq_idx": torch.zeros(2, 39, dtype=torch.int32)}, r"seq_idx shape \(2, 39\) != .* \(2, 40\)",
                 id="seq_idx-shape"),
    pytest.param({"seq_idx": torch.zeros(2, 40)}, r"seq_idx dtype torch.float32 is not int32 or int64",
                 id="seq_idx-dtype"),
    pytest.param({"x": torch.zeros(2, 40, 4, 16, dtype=torch.int32)}, r"x dtype torch.int32 is not one of",
                 id="x-dtype"),
    pytest.param({"dt_limit": (0.5, 0.1)}, r"dt_limit \(0.5, 0.1\) must be \(min, max\)", id="dt_limit"),
]


@pytest.mark.parametrize("change,match", BAD)
def test_bad_inputs_raise_value_error(change, match):
    with pytest.raises(ValueError, match=match):
        mamba_chunk_scan_combined(**{**_good(), **change})

