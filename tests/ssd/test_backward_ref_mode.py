"""The SSD backward in Helion ref mode on CPU: each backward kernel and the autograd drop-in
against the reference gradients (autograd through autotune_cli.reference, stage by stage, and
through the sequential recurrence).

Bound as in the forward (test_kernels_ref_mode.py): err(ours) <= 2 * err(eager torch in the
same dtype) + atol, max-abs errors against fp32, atol scaled by the gradient's size
(gradients reach ~100 here). Outputs allocated with torch.empty start as NaN; block sizes
are the smallest each kernel allows (conftest.py), so every loop runs several tiles.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.reference import ssd_chunked_grads, ssd_recurrent_ref
from autotune_cli.tuning import get
from autotune_cli.tuning.ssd.inputs import SSDInputs
from mamba_tune import keys, runtime
from mamba_tune.keys import bwd_partials, dbdc_head_runs
from mamba_tune.ssd import mamba_chunk_scan_combined

pytestmark = pytest.mark.usefixtures("ssd_ref_mode", "nan_empty")

# (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size)
SHAPES = [
    pytest.param((2, 80, 4, 24, 2, 24, 32), id="L80-Q32-G2-P24-N24"),  # seqlen % chunk_size != 0
    pytest.param((1, 64, 1, 16, 1, 16, 16), id="H1-G1-L64-Q16"),  # one head, exact chunks
    pytest.param((2, 37, 6, 20, 3, 24, 16), id="L37-Q16-G3-P20-N24"),  # odd sizes, 3 groups
]
STAGES = ["ssd_chunk_state_passing_bwd", "ssd_state_passing_bwd", "ssd_chunk_scan_chunk_state_bwd_dx", "ssd_chunk_state_scan_bwd_dbdc",
          "ssd_chunk_state_scan_bwd_dcb", "ssd_bmm_bwd_dbdc", "ssd_chunk_cumsum_bwd"]
NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")


def _dims(shape: tuple[int, ...], **flags: int) -> dict[str, int]:
    b, L, H, P, G, N, Q = shape
    return {"batch": b, "seqlen": L, "nheads": H, "headdim": P, "ngroups": G, "dstate": N, "chunk_size": Q,
            **bwd_partials(P, N), "runs": dbdc_head_runs(b, -(-L // Q), G, H), **flags}


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _assert_bounded(name: str, out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, atol: float) -> None:
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert not out.isnan().any(), f"{name}: NaN in the output (an unwritten tile?)"
    scale = max(ref.abs().max().item(), 1.0)
    err, bound = _max_err(out, ref), 2 * _max_err(low, ref) + atol * scale
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * eager-{low.dtype} error + atol = {bound:.3e}"


# --- each backward kernel through its tuning record -----------------------------------

# bf16's atol is half an ulp at the gradient's largest entry: the kernels read the entering
# states in bf16 (as mamba-ssm's dC and dstates kernels do) where the stage reference in
# eager bf16 keeps its state passing in fp32 (d dA_last came out 1.2x over 2x + 1e-3).
STAGE_RUNS = [
    pytest.param(torch.float32, 1e-5, "min", id="fp32-min-blocks"),
    pytest.param(torch.bfloat16, 2e-3, "min", id="bf16-min-blocks"),
    pytest.param(torch.bfloat16, 2e-3, "max", id="bf16-max-blocks"),
]


@pytest.mark.parametrize("dtype,atol,ssd_ref_mode", STAGE_RUNS, indirect=["ssd_ref_mode"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("flags", [pytest.param(0, id="flags-off"), pytest.param(1, id="flags-on")])
@pytest.mark.parametrize("stage", STAGES)
def test_backward_stage_matches_reference(stage, flags, shape, dtype, atol, ssd_ref_mode):
    tk = get(stage)
    all_flags = {"has_dt_bias": flags, "dt_softplus": flags, "has_D": flags, "has_z": flags, "has_seq_idx": flags,
                 "has_initial_states": flags, "has_dfinal": flags}
    dims = {k: v for k, v in _dims(shape, **all_flags).items() if k in tk.dims}
    problem = tk.make_problem(dims, dtype, torch.device("cpu"), 0)
    outputs = problem.outputs(problem.run(lambda *args: runtime.run(tk.runtime, args)))
    ref, low = problem.reference(), problem.lowp_reference()
    assert outputs.keys() == ref.keys() == low.keys()
    for name in ref:
        _assert_bounded(f"{stage}.{name}", outputs[name], ref[name], low[name], atol)


@pytest.mark.parametrize("target,splits", [pytest.param(1, 1, id="one-run"), pytest.param(10**6, 3, id="run-per-head")])
@pytest.mark.parametrize("flags", [pytest.param(0, id="flags-off"), pytest.param(1, id="flags-on")])
def test_dbdc_head_runs_agree_with_the_reference(flags, target, splits, monkeypatch):
    """dB and dC with each group's heads in one program (Nemotron's groups) and split into runs
    with fp32 partials (Mamba2's one 80-head group): both within the stage's bound."""
    monkeypatch.setattr(keys, "DBDC_TARGET_PROGRAMS", target)
    tk = get("ssd_chunk_state_scan_bwd_dbdc")
    shape = (2, 80, 6, 24, 2, 24, 32)  # 3 heads per group
    dims = {k: v for k, v in _dims(shape, has_z=flags, has_seq_idx=flags).items() if k in tk.dims}
    problem = tk.make_problem(dims, torch.bfloat16, torch.device("cpu"), 0)
    assert problem.args[0].shape[0] == splits
    assert problem.args[0].dtype == (torch.bfloat16 if splits == 1 else torch.float32)
    outputs = problem.outputs(problem.run(lambda *args: runtime.run(tk.runtime, args)))
    ref, low = problem.reference(), problem.lowp_reference()
    for name in ref:
        _assert_bounded(f"dbdc.{name}", outputs[name], ref[name], low[name], 2e-3)


# --- the autograd drop-in -------------------------------------------------------------

OPTIONS = [
    pytest.param({"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1}, id="mixer"),
    pytest.param({}, id="plain"),
    pytest.param({"has_D": 1, "has_z": 1, "D_per_head": False}, id="Dhp-z"),
    pytest.param({"has_dt_bias": 1, "dt_softplus": 1, "dt_limit": (0.004, 0.05)}, id="dt_limit"),
    pytest.param({"has_dt_bias": 1, "dt_limit": (0.0, 0.03)}, id="dt_limit-no-softplus"),
    pytest.param({"has_initial_states": 1, "has_dt_bias": 1, "dfinal": 1}, id="init-bias-dfinal"),
    pytest.param({"has_seq_idx": 1, "dt_softplus": 1}, id="seq_idx"),
    pytest.param({"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1, "dfinal": 1},
                 id="seq_idx-init-z-D-dfinal"),
]


def _inputs(shape, options, dtype, seed=0) -> SSDInputs:
    flags = {k: v for k, v in options.items() if k not in ("dt_limit", "D_per_head", "dfinal")}
    return SSDInputs.make(_dims(shape, **flags), dtype, "cpu", seed, dt_limit=options.get("dt_limit", (0.0, float("inf"))),
                          D_per_head=options.get("D_per_head", True))


def _out_grads(i: SSDInputs, with_dfinal: bool, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    dy = torch.randn(*i.x.shape, generator=gen).to(i.x.dtype)
    b, _, H, P = i.x.shape
    dfinal = torch.randn(b, H, P, i.B.shape[3], generator=gen) if with_dfinal else None
    return dy, dfinal


def _our_grads(i: SSDInputs, dy: torch.Tensor, dfinal: torch.Tensor | None) -> dict[str, torch.Tensor]:
    leaves = {k: getattr(i, k).detach().clone().requires_grad_() for k in NAMES if getattr(i, k) is not None}
    kw = {**i.kwargs(), **{k: v for k, v in leaves.items() if k not in ("x", "dt", "A", "B", "C")}}
    out, final = mamba_chunk_scan_combined(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"],
                                           i.chunk_size, return_final_states=True, **kw)
    roots, grads = [out], [dy]
    if dfinal is not None:
        roots.append(final)
        grads.append(dfinal)
    got = torch.autograd.grad(roots, list(leaves.values()), grads)
    return dict(zip(leaves, got, strict=True))


def _recurrent_grads(i: SSDInputs, dy: torch.Tensor, dfinal: torch.Tensor | None) -> dict[str, torch.Tensor]:
    u = i.upcast()
    leaves = {k: getattr(u, k).detach().clone().requires_grad_() for k in NAMES if getattr(u, k) is not None}
    kw = {**u.kwargs(), **{k: v for k, v in leaves.items() if k not in ("x", "dt", "A", "B", "C")}}
    out, final = ssd_recurrent_ref(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], **kw)
    roots, grads = [out], [dy.float()]
    if dfinal is not None:
        roots.append(final)
        grads.append(dfinal)
    got = torch.autograd.grad(roots, list(leaves.values()), grads)
    return dict(zip(leaves, got, strict=True))


def _check_grads(i: SSDInputs, with_dfinal: bool, atol: float) -> None:
    dy, dfinal = _out_grads(i, with_dfinal)
    ours = _our_grads(i, dy, dfinal)
    ref = _recurrent_grads(i, dy, dfinal)
    low = ssd_chunked_grads(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, dy, dfinal, upcast=False, **i.kwargs())
    assert ours.keys() == ref.keys()
    for name in ours:
        assert ours[name].dtype == getattr(i, name).dtype, f"d{name} dtype {ours[name].dtype}"
        _assert_bounded(f"d{name}", ours[name], ref[name], low[name], atol)


COMBINED_CASES = [pytest.param(SHAPES[0].values[0], *opt.values, id=f"{SHAPES[0].id}-{opt.id}") for opt in OPTIONS] + [
    pytest.param(shape.values[0], *opt.values, id=f"{shape.id}-{opt.id}")
    for shape in SHAPES[1:] for opt in (OPTIONS[0], OPTIONS[-1])
]


# B2 + B3 both ways (these small shapes take the split by the shape rule; MAMBA_TUNE_SSD_SP_BWD picks).
SP_PATHS = pytest.mark.parametrize("sp_path", ["fused", "split"])


@SP_PATHS
@pytest.mark.parametrize("shape,options", COMBINED_CASES)
def test_gradients_bf16_match_recurrence(shape, options, sp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", sp_path)
    _check_grads(_inputs(shape, options, torch.bfloat16), bool(options.get("dfinal")), atol=1e-3)


@pytest.mark.parametrize("dtype,atol", [pytest.param(torch.float32, 1e-5, id="fp32"),
                                        pytest.param(torch.float16, 5e-4, id="fp16")])
def test_gradients_other_dtypes(dtype, atol):
    options = {"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    _check_grads(_inputs((2, 80, 4, 24, 2, 24, 32), options, dtype, seed=5), True, atol)


@SP_PATHS
def test_gradcheck_fp32_fast_mode(sp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", sp_path)
    # Finite differences of our own forward against our backward (fp32: the kernels'
    # contract is fp32/fp16/bf16 and they accumulate in fp32, so fp64 is not an option).
    i = _inputs((1, 40, 2, 16, 1, 16, 16), {"has_dt_bias": 1, "dt_softplus": 1, "has_D": 1, "has_z": 1,
                                             "has_initial_states": 1, "has_seq_idx": 1}, torch.float32, seed=3)
    leaves = [getattr(i, k).detach().clone().requires_grad_() for k in NAMES]

    def fn(x, dt, A, B, C, D, z, dt_bias, init):
        out, final = mamba_chunk_scan_combined(x, dt, A, B, C, i.chunk_size, D=D, z=z, dt_bias=dt_bias,
                                               initial_states=init, seq_idx=i.seq_idx, dt_softplus=True,
                                               return_final_states=True)
        return out, final

    assert torch.autograd.gradcheck(fn, leaves, eps=1e-3, atol=2e-2, rtol=2e-2, fast_mode=True)


@SP_PATHS
def test_backward_is_deterministic(sp_path, monkeypatch):
    monkeypatch.setenv("MAMBA_TUNE_SSD_SP_BWD", sp_path)
    i = _inputs((2, 80, 4, 24, 2, 24, 32), {"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1,
                                            "has_dt_bias": 1, "dt_softplus": 1}, torch.bfloat16, seed=2)
    dy, dfinal = _out_grads(i, True)
    a, b = _our_grads(i, dy, dfinal), _our_grads(i, dy, dfinal)
    for name in a:
        assert torch.equal(a[name], b[name]), f"d{name} differs between two runs"


def test_no_grad_needed_runs_the_forward_only():
    i = _inputs((1, 48, 2, 16, 1, 16, 16), {"has_D": 1}, torch.float32)
    x = i.x.detach().requires_grad_()
    with torch.no_grad():
        out = mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size, D=i.D)
    assert not out.requires_grad
    out = mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size, D=i.D)
    assert out.requires_grad
    (dx,) = torch.autograd.grad(out.sum(), [x])
    assert dx.shape == x.shape


@pytest.mark.parametrize("ssd_ref_mode", ["max"], indirect=True)
def test_dD_with_z_keeps_fp32_dout(ssd_ref_mode):
    # dD sums dout * x over the whole sequence: with dout = dy * silu(z) rounded to bf16
    # before the sum, dD per headdim was 1e4x further from fp32 than mamba-ssm's at Nano
    # TP1 on the H200. In fp32 it matches the fp32 reference to fp32 rounding.
    i = _inputs((1, 1024, 1, 16, 1, 16, 64), {"has_D": 1, "has_z": 1, "D_per_head": False}, torch.bfloat16)
    dy, _ = _out_grads(i, False)
    ours, ref = _our_grads(i, dy, None), _recurrent_grads(i, dy, None)
    assert _max_err(ours["D"], ref["D"]) <= 1e-4 * ref["D"].abs().max().item()


@pytest.mark.parametrize("ssd_ref_mode", ["max"], indirect=True)
def test_ddA_pair_sums_keep_fp32_precision(ssd_ref_mode):
    # ddA = dout . y - dt~ ddt~ per position, reverse-cumsummed over each chunk: F5's chunk-term
    # products cancel there in pairs (row sums against column sums), so the dx kernel takes
    # both sums from fp32 scores times dout . x. With the scores rounded to bf16 in either sum
    # (as a bf16 dot gives), dA came out 0.86-2.4 and ddt_bias 1.9-6.0 from fp32 here, against
    # 0.106 and 0.069 with the exact products and 0.037 and 0.58 for eager bf16 (CPU). Realistic
    # sizes (chunk 128, headdim 64), where the sums are long. dA's remaining error is the
    # states' and state gradients' rounding to bf16 for the dots (mamba-ssm's too: 0.108 in a
    # torch emulation of its backward), which eager torch keeps in fp32: 2x eager + atol as
    # elsewhere; ddt_bias within eager bf16's error itself.
    i = _inputs((1, 1024, 2, 64, 1, 64, 128), OPTIONS[0].values[0], torch.bfloat16)
    dy, _ = _out_grads(i, False)
    ours = _our_grads(i, dy, None)
    u = i.upcast()
    ref = ssd_chunked_grads(u.x, u.dt, u.A, u.B, u.C, i.chunk_size, dy.float(), **u.kwargs())
    low = ssd_chunked_grads(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, dy, upcast=False, **i.kwargs())
    _assert_bounded("dA", ours["A"], ref["A"], low["A"], 1e-3)
    err, bound = _max_err(ours["dt_bias"], ref["dt_bias"]), _max_err(low["dt_bias"], ref["dt_bias"])
    assert err <= bound, f"ddt_bias: max error {err:.3e} > eager bf16's {bound:.3e}"


def test_gradients_through_noncontiguous_projection():
    # x, B, C as slices of one projection (the Mamba-2 layer's in_proj): the gradient
    # reaches the projection, equal to the recurrence's.
    i = _inputs((2, 50, 4, 16, 2, 16, 16), {"has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}, torch.float32)
    b, L, H, P = i.x.shape
    N = i.B.shape[3]
    gen = torch.Generator().manual_seed(4)
    proj = torch.randn(b, L, H * P + 2 * 2 * N, generator=gen)
    dy = torch.randn(b, L, H, P, generator=gen)

    def grad_of(fn):
        leaf = proj.clone().requires_grad_()
        x = leaf[..., : H * P].view(b, L, H, P)
        B = leaf[..., H * P : H * P + 2 * N].view(b, L, 2, N)
        C = leaf[..., H * P + 2 * N :].view(b, L, 2, N)
        (g,) = torch.autograd.grad(fn(x, B, C), [leaf], dy)
        return g

    ours = grad_of(lambda x, B, C: mamba_chunk_scan_combined(x, i.dt, i.A, B, C, 16, D=i.D, dt_bias=i.dt_bias,
                                                             dt_softplus=True))
    ref = grad_of(lambda x, B, C: ssd_recurrent_ref(x, i.dt, i.A, B, C, D=i.D, dt_bias=i.dt_bias, dt_softplus=True)[0])
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("ssd_ref_mode", ["max"], indirect=True)
def test_cumsum_bwd_check_at_nano_counts_ddt_in_dts_dtype(ssd_ref_mode):
    """The tuner's check of the cumsum backward at Nemotron-3 Nano TP1: ddt comes out in dt's
    dtype (bf16, as mamba-ssm's does) and reaches ~20, where bf16's ulp is 0.125, far over the
    bf16 atol (0.01). The check's fp32 reference must be fp32 (autograd rounded a bf16 leaf's
    gradient to bf16: the H200 tune failed every config, the default too, on a one-ulp tie) and
    its eager-bf16 reference rounds ddt as eager torch does, so a correct kernel passes."""
    from autotune_cli.spec import DEFAULT_TOLERANCES
    from autotune_cli.tuner import check_accuracy

    tk = get("ssd_chunk_cumsum_bwd")
    dims = {"batch": 2, "seqlen": 8192, "nheads": 64, "chunk_size": 128, "has_dt_bias": 1, "dt_softplus": 1,
            **bwd_partials(64, 128)}
    problem = tk.make_problem(dims, torch.bfloat16, torch.device("cpu"), 0)
    ref, low = problem.reference(), problem.lowp_reference()
    assert ref["ddt"].abs().max() >= 4.0  # the range where one bf16 rounding exceeds atol
    assert not torch.equal(ref["ddt"], ref["ddt"].bfloat16().float())  # fp32, not bf16 values
    assert torch.equal(low["ddt"], ref["ddt"].bfloat16().float())
    assert torch.equal(low["dA"], ref["dA"])  # A and dt_bias are fp32 leaves: nothing rounded
    acc = check_accuracy(problem, problem.run(lambda *args: runtime.run(tk.runtime, args)), DEFAULT_TOLERANCES["bf16"])
    assert acc.max_abs_err["ddt"] > DEFAULT_TOLERANCES["bf16"].atol, acc  # it would fail an fp32-only bound
    assert acc.passed, acc


# --- what the autograd forward keeps for the backward ---------------------------------


def _kept(out: torch.Tensor) -> dict[str, bool]:
    """Which intermediates out's autograd node kept (None: recomputed in the backward)."""
    saved = out.grad_fn.saved_tensors
    names = ("dA_cumsum", "dt_out", "prev_states", "cb")
    return {n: t is not None for n, t in zip(names, saved[len(NAMES) + 1:], strict=True)}


@pytest.mark.parametrize("shape,expect", [
    # dstate = chunk_size (Nemotron-3 Nano's proportions): the entering states are the output's
    # size, so they use up mamba-ssm's budget (output + dA_cumsum) and F1 and F4 are recomputed.
    pytest.param((1, 64, 8, 32, 1, 16, 16), {"prev_states": True, "dA_cumsum": False, "cb": False}, id="N=Q"),
    # dstate = 2 chunk_size (47B's): the states are twice the output; F1's and F4's outputs fit.
    pytest.param((1, 64, 8, 32, 1, 32, 16), {"prev_states": False, "dA_cumsum": True, "cb": True}, id="N=2Q"),
    # chunk_size = 2 dstate (Mamba2's): everything fits. (C B^T is fp32 and grows with chunk_size
    # squared: 8 heads of 32 keep it below the output, as real head counts do.)
    pytest.param((1, 64, 8, 32, 1, 16, 32), {"prev_states": True, "dA_cumsum": True, "cb": True}, id="Q=2N"),
])
def test_forward_keeps_intermediates_within_mamba_ssms_saved_bytes(shape, expect):
    i = _inputs(shape, {"has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}, torch.bfloat16)
    x = i.x.detach().requires_grad_()
    out = mamba_chunk_scan_combined(x, i.dt, i.A, i.B, i.C, i.chunk_size, **i.kwargs())
    kept = _kept(out)
    assert kept["dA_cumsum"] == kept["dt_out"]
    assert {k: kept[k] for k in expect} == expect
    # Never more bytes than mamba-ssm keeps beyond its inputs: its output and dA_cumsum (fp32).
    b, L, H, _P, _G, _N, Q = shape
    budget = x.numel() * x.element_size() + b * H * (-(-L // Q)) * Q * 4
    extra = out.grad_fn.saved_tensors[len(NAMES) + 1:]
    assert sum(t.numel() * t.element_size() for t in extra if t is not None) <= budget


@pytest.mark.parametrize("shape", [pytest.param(s.values[0], id=s.id) for s in SHAPES])
def test_kept_intermediates_give_the_recomputed_gradients_bitwise(shape, monkeypatch):
    from mamba_tune.ssd import combined

    options = {"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1, "has_dt_bias": 1, "dt_softplus": 1}
    i = _inputs(shape, options, torch.bfloat16, seed=4)
    dy, dfinal = _out_grads(i, True)
    kept = _our_grads(i, dy, dfinal)
    monkeypatch.setattr(combined, "SAVE_INTERMEDIATES", False)
    recomputed = _our_grads(i, dy, dfinal)
    for name in kept:
        assert torch.equal(kept[name], recomputed[name]), f"d{name}: kept intermediates change the gradient"
