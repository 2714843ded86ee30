"""SSD kernels compiled for real on a CUDA GPU, at model sizes (`pytest tests/ssd -m gpu`).

The same checks as test_kernels_ref_mode.py, at Nemotron-3 Nano's dims (batch 2, seqlen
8192, nheads 64, headdim 64, ngroups 8, dstate 128, chunk_size 128, bf16) and Mamba2-2.7B's
(one group, chunk_size 256), with the configs the runtime picks (tuned bundles, else
Helion's default config). Against mamba-ssm's `mamba_chunk_scan_combined` too when it is
importable: our error against fp32 must be within twice mamba-ssm's plus atol.
"""

from __future__ import annotations

import pytest
import torch

from autotune_cli.benchmarks.common import capture
from autotune_cli.reference import bmm_chunk_ref, ssd_chunked_ref, ssd_recurrent_ref
from autotune_cli.tuning import ModelShape, get
from autotune_cli.tuning.ssd.inputs import SSDInputs, mamba_ssm_ops, mixer_dims
from mamba_tune import runtime
from mamba_tune.ssd import mamba_chunk_scan_combined, ssd_forward
from mamba_tune.ssd.bmm import bmm_chunk_fwd, mask_other_sequences

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MODELS = [
    pytest.param(ModelShape(batch=2, seqlen=8192, nheads=64, headdim=64, ngroups=8, dstate=128, chunk_size=128),
                 id="nemotron3-nano"),
    pytest.param(ModelShape(batch=2, seqlen=8192, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256),
                 id="mamba2-2.7b"),
]
STAGES = ["ssd_chunk_cumsum", "ssd_chunk_state", "ssd_chunk_state_passing", "ssd_bmm",
          "ssd_chunk_scan"]
# fp32 dots run as tf32 on the GPU (as in mamba-ssm): 10 mantissa bits, an error eager fp32
# does not have, so fp32 gets an atol of tf32 size (outputs here reach ~20).
ATOL = {torch.bfloat16: 1e-2, torch.float32: 5e-2}


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _assert_bounded(name: str, out: torch.Tensor, ref: torch.Tensor, low: torch.Tensor, atol: float) -> None:
    assert not out.isnan().any(), f"{name}: NaN in the output"
    err, bound = _max_err(out, ref), 2 * _max_err(low, ref) + atol
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * eager-{low.dtype} error + atol = {bound:.3e}"


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("stage", STAGES)
def test_stage_at_model_size(stage, model, nan_empty):
    tk = get(stage)
    dims = tk.dims_for(model)
    problem = tk.make_problem(dims, torch.bfloat16, torch.device("cuda"), 0)
    outputs = problem.outputs(problem.run(lambda *args: runtime.run(tk.runtime, args)))
    ref, low = problem.reference(), problem.lowp_reference()
    for name in ref:
        _assert_bounded(f"{stage}.{name}", outputs[name], ref[name], low[name], ATOL[torch.bfloat16])


def _model_inputs(model: ModelShape, seed: int = 0, **flags: int) -> SSDInputs:
    return SSDInputs.make({**mixer_dims(model), **flags}, torch.bfloat16, "cuda", seed)


@pytest.mark.parametrize("model", MODELS)
def test_combined_at_model_size(model, nan_empty):
    i = _model_inputs(model)
    out, final = ssd_forward(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, **i.kwargs())
    u = i.upcast()
    ref_out, ref_final = ssd_chunked_ref(u.x, u.dt, u.A, u.B, u.C, i.chunk_size, **u.kwargs())
    low_out, low_final = ssd_chunked_ref(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, upcast=False, **i.kwargs())
    _assert_bounded("out", out, ref_out, low_out, ATOL[torch.bfloat16])
    _assert_bounded("final_states", final, ref_final, low_final, ATOL[torch.bfloat16])


OPTIONS = [
    pytest.param({"has_z": 1, "has_D": 1}, id="z-D"),
    pytest.param({"has_initial_states": 1, "has_seq_idx": 1}, id="init-seq_idx"),
    pytest.param({"has_seq_idx": 1, "has_initial_states": 1, "has_z": 1, "has_D": 1, "D_hp": 1}, id="all"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("options", OPTIONS)
def test_combined_options_against_recurrence(options, dtype, nan_empty):
    # Seqlen 1000 (not a multiple of 64), two groups: every option against the recurrence.
    dims = {"batch": 2, "seqlen": 1000, "nheads": 8, "headdim": 64, "ngroups": 2, "dstate": 64, "chunk_size": 64,
            "has_dt_bias": 1, "dt_softplus": 1, **{k: v for k, v in options.items() if k != "D_hp"}}
    i = SSDInputs.make(dims, dtype, "cuda", 1, dt_limit=(0.002, 0.08), D_per_head=not options.get("D_hp"))
    out, final = mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, return_final_states=True,
                                           **i.kwargs())
    u = i.upcast()
    ref_out, ref_final = ssd_recurrent_ref(u.x, u.dt, u.A, u.B, u.C, **u.kwargs())
    low_out, low_final = ssd_chunked_ref(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, upcast=False, **i.kwargs())
    _assert_bounded("out", out, ref_out, low_out, ATOL[dtype])
    _assert_bounded("final_states", final, ref_final, low_final, ATOL[dtype])


@pytest.mark.parametrize("options", [pytest.param({}, id="mixer"), *OPTIONS])
@pytest.mark.parametrize("model", MODELS[:1])
def test_matches_mamba_ssm(model, options):
    found = mamba_ssm_ops()
    if found is None:
        pytest.skip("mamba_ssm is not importable")
    mods, _name = found
    flags = {k: v for k, v in options.items() if k != "D_hp"}
    i = SSDInputs.make({**mixer_dims(model), **flags}, torch.bfloat16, "cuda", 2,
                       D_per_head=not options.get("D_hp"))
    ours, ours_final = mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, return_final_states=True,
                                                 **i.kwargs())
    theirs, theirs_final = mods["combined"].mamba_chunk_scan_combined(
        i.x, i.dt, i.A, i.B, i.C, i.chunk_size, return_final_states=True, **i.kwargs())
    u = i.upcast()
    ref_out, ref_final = ssd_chunked_ref(u.x, u.dt, u.A, u.B, u.C, i.chunk_size, **u.kwargs())
    _assert_bounded("out vs mamba-ssm", ours, ref_out, theirs, ATOL[torch.bfloat16])
    _assert_bounded("final_states vs mamba-ssm", ours_final, ref_final, theirs_final, 1e-3)


@pytest.mark.parametrize("options", [pytest.param({}, id="mixer"), OPTIONS[2]])
def test_cuda_graph_capture(options):
    """The forward has no sync and no search once compiled: it captures in a CUDA graph, and
    a replay gives the eager call's bits (packed sequences included)."""
    dims = {**mixer_dims(MODELS[0].values[0]), **{k: v for k, v in options.items() if k != "D_hp"}}
    i = SSDInputs.make(dims, torch.bfloat16, "cuda", 3, D_per_head=not options.get("D_hp"))

    def step():
        return mamba_chunk_scan_combined(i.x, i.dt, i.A, i.B, i.C, i.chunk_size, return_final_states=True,
                                         **i.kwargs())

    eager = step()  # compiles and resolves configs outside the capture
    graph, (captured,) = capture(step)
    graph.replay()
    torch.cuda.synchronize()
    for a, c in zip(eager, captured, strict=True):
        assert torch.equal(a, c)


# Configs whose in-kernel seq_idx mask gave garbage CB on the H200 (max error 62.6 at Nano's
# sizes) while the same configs without the mask were right: F4 with seq_idx runs the
# maskless kernel and masks after it (bmm.py), which must be right under each of them.
MISCOMPILED_MASK_CONFIGS = [([128, 128, 32], 4, 4), ([128, 64, 32], 1, 4), ([64, 128, 32], 3, 4)]


@pytest.mark.parametrize("block_sizes,num_stages,num_warps", MISCOMPILED_MASK_CONFIGS)
def test_bmm_with_seq_idx_is_right_where_the_in_kernel_mask_miscompiled(block_sizes, num_stages, num_warps):
    import helion

    tk = get("ssd_bmm")
    dims = {"batch": 2, "seqlen": 8192, "ngroups": 8, "dstate": 128, "chunk_size": 128}
    i = SSDInputs.make({**dims, "nheads": 8, "has_seq_idx": 1}, torch.bfloat16, "cuda", 0)
    bound = tk.kernel.bind((i.C, i.B, i.chunk_size))
    fn = bound.compile_config(helion.Config(block_sizes=block_sizes, num_stages=num_stages, num_warps=num_warps),
                              allow_print=False)
    cb = mask_other_sequences(fn(i.C, i.B, i.chunk_size), i.seq_idx, i.chunk_size)
    ref = bmm_chunk_ref(i.C.float(), i.B.float(), i.chunk_size, i.seq_idx)
    lowp = bmm_chunk_ref(i.C, i.B, i.chunk_size, i.seq_idx, upcast=False)
    assert i.seq_idx is not None and int(i.seq_idx.max()) > 0
    _assert_bounded("CB", cb, ref, lowp, ATOL[torch.bfloat16])
    # And the public F4, as the pipeline calls it.
    _assert_bounded("CB (bmm_chunk_fwd)", bmm_chunk_fwd(i.C, i.B, i.chunk_size, i.seq_idx), ref, lowp,
                    ATOL[torch.bfloat16])


def test_benchmark_runs_and_reports_every_stage():
    from autotune_cli.benchmarks.ssd import bench_ssd

    shape = ModelShape(batch=1, seqlen=1024, nheads=8, headdim=64, ngroups=2, dstate=64, chunk_size=128)
    rows = bench_ssd([("small", shape)], torch.bfloat16, rep_ms=5)
    stages = {r["stage"] for r in rows}
    assert {"chunk_cumsum", "chunk_state", "chunk_state_passing", "bmm", "bmm_seq_idx",
            "chunk_scan", "total", "total_seq_idx", "total_wall", "total_graph"} <= stages
    graph = next(r for r in rows if r["stage"] == "total_graph")
    assert graph["ours_ms"] is not None and graph["ours_ms"] > 0  # ours captures in a CUDA graph
    assert all(r["ours_ms"] > 0 for r in rows)
    only = bench_ssd([("small", shape)], torch.bfloat16, rep_ms=5, stages=("total", "total_seq_idx"))
    assert [r["stage"] for r in only] == ["total", "total_seq_idx"]
    assert all(r["ours_ms"] > 0 for r in rows)
