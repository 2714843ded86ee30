"""`mamba-tune bench --family layer` without a GPU: its arguments, its shapes, and that every
callable it times on our side runs (CPU, Helion ref mode, tiny dims). The timings themselves
need the GPU (`pytest -m gpu` and the bench command on the device machine)."""

from __future__ import annotations

import pytest
import torch
from bench_cli import assert_bench_refuses

from autotune_cli.benchmarks import layer
from autotune_cli.benchmarks.common import LAYER_STAGES, recomputing
from autotune_cli.presets import MODEL_PRESETS, ModelDims


@pytest.mark.parametrize("args,message", [
    (["--family", "layer", "--layer-stage", "layer_fwdd"],
     "--layer-stage 'layer_fwdd': unknown; known: layer_fwd, layer_fwd_bwd"),
    (["--family", "ssd", "--layer-stage", "ssd"], "--layer-stage: only with --family layer or all"),
    (["--family", "layer", "--ssd-stage", "total"], "--ssd-stage: only with --family ssd or all"),
    (["--family", "layer", "--model", "nemotron-3-nano-30b", "--tp", "3"],
     "--tp 3 does not divide nemotron-3-nano-30b's nheads 64 and ngroups 8"),
    (["--family", "layer", "--model", "nano"], "--model 'nano': unknown preset"),
])
def test_bench_layer_rejects_bad_arguments_before_touching_a_gpu(tmp_path, args, message):
    assert_bench_refuses(tmp_path, args, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_layer_without_a_gpu_is_a_one_line_error(tmp_path):
    assert_bench_refuses(tmp_path, ["--family", "layer", "--model", "nemotron-3-nano-30b", "--tp", "2",
                                    "--layer-stage", "layer_fwd_bwd"], "no CUDA GPU")
    with pytest.raises(RuntimeError, match="bench_layer needs a CUDA GPU"):
        layer.bench_layer([], torch.bfloat16)
    with pytest.raises(ValueError, match=r"unknown layer stage\(s\) \['x'\]"):
        layer.bench_layer([], torch.bfloat16, stages=["x"])


def test_layer_shapes_of_the_presets():
    nano = MODEL_PRESETS["nemotron-3-nano-30b"]
    s = layer.layer_shape(nano, 1, 2, 8192)
    # Nemotron-3 Nano's Mamba-2 in_proj: 2 * 4096 (z, x) + 2 * 8 * 128 (B, C) + 64 (dt) = 10304 columns.
    assert (s.dim, s.conv_dim, s.d_in_proj, s.d_model) == (4096, 6144, 10304, 2688)
    s2 = layer.layer_shape(nano, 2, 2, 8192)
    assert (s2.nheads, s2.ngroups, s2.dim, s2.d_in_proj, s2.d_model) == (32, 4, 2048, 2 * 2048 + 1024 + 32, 2688)
    with pytest.raises(ValueError, match="tp=3 does not divide nheads=64 and ngroups=8"):
        layer.layer_shape(nano, 3, 2, 8192)


TINY = ModelDims(d_model=32, nheads=4, headdim=8, ngroups=2, dstate=16, chunk_size=16)


@pytest.mark.usefixtures("layer_ref_mode")
def test_every_timed_callable_of_ours_runs():
    s = layer.layer_shape(TINY, 1, 2, 40)
    i = layer.LayerInputs.make(s, torch.float32, device="cpu")
    ours_fn, _ = layer._fused_fns()
    out = layer.layer_step(ours_fn, s, i, backward=False)()
    assert out.shape == (2, 40, 32) and torch.isfinite(out).all()
    grads = layer.layer_step(ours_fn, s, i, backward=True)()
    assert [tuple(g.shape) for g in grads] == [(2, 40, 32), *(tuple(getattr(i, k).shape) for k in layer.WEIGHTS)]
    again = recomputing(layer.layer_step(ours_fn, s, i, backward=True))()  # the layer_fwd_bwd_recompute row
    assert all(torch.equal(a, b) for a, b in zip(grads, again, strict=True))
    grads = layer.layer_step(ours_fn, s, i, backward=True, with_in_proj=False)()
    assert tuple(grads[0].shape) == (2, 40, s.d_in_proj) and len(grads) == len(layer.WEIGHTS)
    ours, _ = layer._stage_fns(s, i, LAYER_STAGES)
    assert set(ours) == set(LAYER_STAGES) - {"layer_fwd", "layer_fwd_bwd", "layer_fwd_bwd_recompute", "fused_fwd",
                                             "fused_fwd_bwd", "layer_fwd_bwd_wall", "layer_fwd_bwd_graph"}
    for stage, fn in ours.items():
        assert fn() is not None, stage
