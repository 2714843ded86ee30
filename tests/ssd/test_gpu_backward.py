"""The SSD backward compiled for real on a CUDA GPU, at model sizes (`pytest tests/ssd -m gpu`).

Each backward kernel through its tuning record at Nemotron-3 Nano's dims (bf16, batch 2,
seqlen 8192); the whole forward+backward against the fp32 reference gradients and against
mamba-ssm's backward on the same inputs: our error against fp32 within twice mamba-ssm's
plus atol, for every gradient; bitwise-equal gradients across runs; CUDA graph capture.
ONE_GROUP (Mamba2 / Zamba2's one group of 80 heads) is where the dB/dC kernel splits a
group's heads into runs with fp32 partials: the dB/dC stage, the gradients against mamba-ssm
and the bitwise check run there too.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.benchmarks.common import capture
from autotune_cli.reference import ssd_chunked_grads
from autotune_cli.tuning import ModelShape, get
from autotune_cli.tuning.ssd.inputs import SSDInputs, mamba_ssm_ops, mixer_dims
from mamba_tune import runtime
from mamba_tune.ssd import mamba_chunk_scan_combined

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

NANO = ModelShape(batch=2, seqlen=8192, nheads=64, headdim=64, ngroups=8, dstate=128, chunk_size=128)
ONE_GROUP = ModelShape(batch=2, seqlen=4096, nheads=80, headdim=64, ngroups=1, dstate=64, chunk_size=256)
STAGES = ["ssd_chunk_state_passing_bwd", "ssd_chunk_scan_chunk_state_bwd_dx", "ssd_chunk_state_scan_bwd_dbdc",
          "ssd_chunk_cumsum_bwd"]
NAMES = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")
ATOL = 1e-2


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _assert_bounded(name: str, out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, atol: float,
                    factor: float = 2.0) -> None:
    assert not out.isnan().any(), f"{name}: NaN"
    err, bound = _max_err(out, ref), factor * _max_err(low, ref) + atol * ref.abs().max().item()
    assert err <= bound, f"{name}: max error {err:.3e} > {factor} * other error + atol = {bound:.3e}"


@pytest.mark.parametrize("stage,shape", [*[pytest.param(s, NANO, id=s) for s in STAGES],
                                         pytest.param("ssd_chunk_state_scan_bwd_dbdc", ONE_GROUP, id="dbdc-one-group"),
                                         pytest.param("ssd_state_passing_bwd", ONE_GROUP, id="walk-one-group")])
def test_backward_stage_at_model_size(stage, shape, nan_empty):
    tk = get(stage)
    dims = tk.dims_for(shape)
    if shape is ONE_GROUP:
        from mamba_tune.ssd.chunk_state_scan_bwd_dbdc import head_splits

        assert head_splits(shape.batch, shape.seqlen // shape.chunk_size, shape.ngroups, shape.nheads) > 1
    problem = tk.make_problem(dims, torch.bfloat16, torch.device("cuda"), 0)
    outputs = problem.outputs(problem.run(lambda *args: runtime.run(tk.runtime, args)))
    ref, low = problem.reference(), problem.lowp_reference()
    for name in ref:
        _assert_bounded(f"{stage}.{name}", outputs[name], ref[name], low[name], ATOL)


def _inputs(flags: dict[str, int], seed: int, d_hp: bool = False, shape: ModelShape = NANO) -> SSDInputs:
    return SSDInputs.make({**mixer_dims(shape), **flags}, torch.bfloat16, "cuda", seed, D_per_head=not d_hp)


def _grads(fn, i: SSDInputs, dy: torch.Tensor, dfinal: torch.Tensor | None) -> dict[str, torch.Tensor]:
    leaves = {k: getattr(i, k).detach().clone().requires_grad_() for k in NAMES if getattr(i, k) is not None}
    kw = {**i.kwargs(), **{k: v for k, v in leaves.items() if k not in ("x", "dt", "A", "B", "C")}}
    out, final = fn(leaves["x"], leaves["dt"], leaves["A"], leaves["B"], leaves["C"], i.chunk_size,
                    return_final_states=True, **kw)
    roots, grads = [out], [dy]
    if dfinal is not None:
        roots.append(final)
        grads.append(dfinal)
    got = torch.autograd.grad(roots, list(leaves.values()), grads)
    return dict(zip(leaves, got, strict=True))


OPTIONS = [
    pytest.param({}, False, NANO, id="mixer"),
    pytest.param({"has_z": 1}, True, NANO, id="z-D_hp"),
    pytest.param({"has_seq_idx": 1, "has_initial_states": 1}, False, NANO, id="seq_idx-init-dfinal"),
    pytest.param({"has_seq_idx": 1}, False, ONE_GROUP, id="one-group-seq_idx"),
]


@pytest.mark.parametrize("flags,d_hp,shape", OPTIONS)
def test_gradients_vs_mamba_ssm(flags, d_hp, shape):
    found = mamba_ssm_ops()
    if found is None:
        pytest.skip("mamba_ssm is not importable")
    mods, _ = found
    i = _inputs(flags, 4, d_hp, shape)
    gen = torch.Generator(device="cpu").manual_seed(5)
    dy = torch.randn(*i.x.shape, generator=gen).to(torch.bfloat16).cuda()
    dfinal = None
    if i.initial_states is not None:
        dfinal = torch.randn(*i.initial_states.shape, generator=gen).cuda()
    ours = _grads(mamba_chunk_scan_combined, i, dy, dfinal)
    theirs = _grads(mods["combined"].mamba_chunk_scan_combined, i, dy, dfinal)
    u = i.upcast()
    ref = ssd_chunked_grads(u.x, u.dt, u.A, u.B, u.C, i.chunk_size, dy.float(), dfinal, **u.kwargs())
    report = []
    for name in ours:
        e_ours, e_theirs = _max_err(ours[name], ref[name]), _max_err(theirs[name], ref[name])
        report.append(f"{name}: ours {e_ours:.3e} mamba-ssm {e_theirs:.3e} ratio {e_ours / max(e_theirs, 1e-30):.2f}")
    print("\n" + "\n".join(report))
    for name in ours:
        _assert_bounded(f"d{name} vs mamba-ssm", ours[name], ref[name], theirs[name], 1e-3)


@pytest.mark.parametrize("shape", [pytest.param(NANO, id="nano"), pytest.param(ONE_GROUP, id="one-group")])
def test_backward_is_deterministic(shape):
    # No atomics: two runs give the same bits, with other work in between.
    i = _inputs({"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1}, 6, shape=shape)
    gen = torch.Generator(device="cpu").manual_seed(6)
    dy = torch.randn(*i.x.shape, generator=gen).to(torch.bfloat16).cuda()
    dfinal = torch.randn(*i.initial_states.shape, generator=gen).cuda()
    a = _grads(mamba_chunk_scan_combined, i, dy, dfinal)
    _grads(mamba_chunk_scan_combined, _inputs({}, 9, shape=shape), torch.randn_like(dy), None)
    b = _grads(mamba_chunk_scan_combined, i, dy, dfinal)
    for name in a:
        assert torch.equal(a[name], b[name]), f"d{name} differs between two runs"


def _assert_captured_step_is_eager(i: SSDInputs, dy: torch.Tensor, names: tuple[str, ...]) -> None:
    """The gradients of `names` from a forward+backward captured in a CUDA graph and replayed:
    bitwise those of the eager step."""
    leaves = {k: getattr(i, k).detach().requires_grad_() for k in names}
    x, dt, A, B, C = (leaves.get(k, getattr(i, k)) for k in ("x", "dt", "A", "B", "C"))

    def step():
        out = mamba_chunk_scan_combined(x, dt, A, B, C, i.chunk_size, **i.kwargs())
        return torch.autograd.grad(out, list(leaves.values()), dy)

    eager = step()
    graph, (captured,) = capture(step)
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(eager, captured, strict=True):
        assert torch.equal(a, c)


def test_backward_captures_in_a_cuda_graph():
    i = _inputs({}, 7)
    _assert_captured_step_is_eager(i, torch.randn_like(i.x), ("x", "dt", "B"))
