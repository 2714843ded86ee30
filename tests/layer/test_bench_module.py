"""`mamba-tune bench --family module` without a GPU: its arguments, the module it builds at the
presets' dims, and that what it times on our side runs mamba-ssm's Mamba2 through mamba-tune's
kernels (CPU, Helion ref mode, tiny dims) while the other side runs mamba-ssm's. The timings
themselves need the GPU (the bench command on the device machine)."""

from __future__ import annotations

import copy
import importlib.util
import json

import mamba_ssm_cpu
import pytest
import torch
from bench_cli import assert_bench_refuses

import mamba_tune
from autotune_cli.benchmarks import layer
from autotune_cli.presets import MODEL_PRESETS, ModelDims
from mamba_tune.ssd import combined

needs_mamba_ssm = pytest.mark.skipif(not mamba_ssm_cpu.installed(),
                                     reason="mamba-ssm is not installed (.ci/run installs it)")


@pytest.mark.parametrize("args,message", [
    (["--family", "module", "--module-stage", "module_fwd"],
     "--module-stage 'module_fwd': unknown; known: module_fwd_mem_eff, module_fwd_wall_mem_eff"),
    (["--family", "layer", "--module-stage", "module_fwd_mem_eff"], "--module-stage: only with --family module"),
    (["--family", "all", "--module-stage", "module_fwd_mem_eff"], "--module-stage: only with --family module"),
    (["--family", "module", "--layer-stage", "ssd"], "--layer-stage: only with --family layer or all"),
    (["--family", "module", "--model", "nemotron-3-nano-30b", "--tp", "3"],
     "--tp 3 does not divide nemotron-3-nano-30b's nheads 64 and ngroups 8"),
    (["--family", "module", "--model", "nano"], "--model 'nano': unknown preset"),
])
def test_bench_module_rejects_bad_arguments_before_touching_a_gpu(tmp_path, args, message):
    assert_bench_refuses(tmp_path, args, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_module_without_a_gpu_is_a_one_line_error(tmp_path):
    from autotune_cli.benchmarks import module

    assert_bench_refuses(tmp_path, ["--family", "module", "--model", "nemotron-3-nano-30b",
                                    "--module-stage", "module_fwd_mem_eff"], "no CUDA GPU")
    with pytest.raises(RuntimeError, match="bench_module needs a CUDA GPU"):
        module.bench_module([], torch.bfloat16)
    with pytest.raises(ValueError, match=r"unknown module stage\(s\) \['x'\]"):
        module.bench_module([], torch.bfloat16, stages=["x"])


@pytest.fixture
def module_bench():
    mamba_ssm_cpu.load()
    from autotune_cli.benchmarks import module

    mamba_tune.unpatch_mamba_ssm()
    yield module
    mamba_tune.unpatch_mamba_ssm()


@needs_mamba_ssm
@pytest.mark.parametrize("name", list(MODEL_PRESETS))
@pytest.mark.parametrize("tp", [1, 2])
def test_the_module_has_the_presets_dims(module_bench, name, tp):
    """Built on the meta device (no memory): Mamba2's own nheads = d_inner / headdim, its in_proj,
    conv1d and norm groups are the preset's, one rank's at TP 2 (d_model whole)."""
    dims = MODEL_PRESETS[name]
    if dims.ngroups % tp:
        pytest.skip(f"{name}: ngroups {dims.ngroups} on one rank")
    s = layer.layer_shape(dims, tp, 2, 8192)
    m = module_bench.build_module(s, torch.bfloat16, "meta", use_mem_eff_path=True)
    assert (m.d_model, m.nheads, m.headdim, m.ngroups, m.d_state, m.chunk_size) == (
        dims.d_model, dims.nheads // tp, dims.headdim, dims.ngroups // tp, dims.dstate, dims.chunk_size)
    assert (m.in_proj.in_features, m.in_proj.out_features) == (dims.d_model, s.d_in_proj)
    assert m.conv1d.weight.shape == (s.conv_dim, 1, 4) and m.out_proj.weight.shape == (dims.d_model, s.dim)
    assert m.norm.group_size == dims.nheads * dims.headdim // dims.ngroups  # one group's width, at any TP
    assert m.use_mem_eff_path and m.in_proj.weight.dtype == torch.bfloat16


# d_model 24 with 4 heads of 8: expand 4/3, as Nemotron-3 Nano's 4096 / 2688 is not an integer.
TINY = ModelDims(d_model=24, nheads=4, headdim=8, ngroups=2, dstate=16, chunk_size=16)
FUSED = {"causal_conv1d_fwd", "causal_conv1d_bwd_slide"}
SSD_NORM = {"ssd_chunk_cumsum", "ssd_chunk_state_passing", "ssd_bmm", "ssd_chunk_scan", "gated_norm_fwd",
            "ssd_chunk_state_passing_bwd", "ssd_chunk_scan_chunk_state_bwd_dx", "ssd_chunk_state_scan_bwd_dbdc",
            "ssd_chunk_cumsum_bwd", "gated_norm_bwd"}


@needs_mamba_ssm
@pytest.mark.usefixtures("layer_ref_mode")
@pytest.mark.parametrize("path", ["mem_eff", "unfused"])
@pytest.mark.parametrize("tp", [1, 2])
def test_what_the_patched_side_times_runs_mamba_tunes_kernels(module_bench, tmp_path, path, tp):
    s = layer.layer_shape(TINY, tp, 2, 40)  # seqlen 40: a partial last chunk
    theirs = module_bench.build_module(s, torch.float32, "cpu", module_bench.PATHS[path])
    ours = copy.deepcopy(theirs)
    u, dout = torch.randn(2, 40, 24), torch.randn(2, 40, 24)
    record = tmp_path / "calls.json"
    with module_bench.side(ours=True), mamba_tune.record_calls(record):
        out = module_bench.module_step(ours, u, dout, backward=False)()
        grads = module_bench.module_step(ours, u, dout, backward=True)()
        with pytest.raises(RuntimeError, match="the unpatched side does not run mamba-ssm's kernels"):
            with module_bench.side(ours=False):
                pass
    assert not mamba_tune.is_patched()
    assert out.shape == (2, 40, 24) and torch.isfinite(out).all()
    params = dict(ours.named_parameters())
    assert [tuple(g.shape) for g in grads] == [(2, 40, 24), *(tuple(p.shape) for p in params.values())]
    assert all(torch.isfinite(g).all() and g.abs().max() > 0 for g in grads)
    kernels = {v["kernel"] for v in json.loads(record.read_text())["calls"].values()}
    # The fused path runs our conv1d too; the unfused one calls the module's own conv1d on both sides.
    # The unfused path runs our conv1d where the patch filled mamba2's missing causal-conv1d (not installed).
    conv_ours = path == "mem_eff" or importlib.util.find_spec("causal_conv1d") is None
    # B2 + B3 on TINY's few heads: F2's kernel then the elementwise walk (combined.split_state_passing_bwd).
    assert combined.split_state_passing_bwd(2, TINY.nheads // tp, TINY.chunk_size)
    ssd_norm = SSD_NORM - {"ssd_chunk_state_passing_bwd"} | {"ssd_chunk_state", "ssd_state_passing_bwd"}
    assert kernels == (ssd_norm | FUSED if conv_ours else ssd_norm)
    assert all(torch.equal(p, q) for p, q in zip(theirs.parameters(), ours.parameters(), strict=True))
    with module_bench.side(ours=False):
        assert not mamba_tune.is_patched()


@needs_mamba_ssm
def test_the_fused_baseline_says_why_it_cannot_run_without_causal_conv1d(module_bench):
    note = module_bench.fused_baseline_missing()
    if importlib.util.find_spec("causal_conv1d") is None:
        assert note == "mamba-ssm's fused path needs the causal-conv1d package (not importable)"
    else:
        assert note is None

