"""`mamba-tune bench --family model` without a GPU: its arguments, the NemotronH model it builds at
Nemotron-H 8B's dims, and that its training step on our side runs mamba-tune's kernels and gives
the loss of the other side, transformers' own path (CPU, Helion ref mode, tiny dims). The
timings themselves need the GPU (the bench command on the device machine)."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json

import hf_tiny
import pytest
import torch
from bench_cli import assert_bench_refuses

import mamba_tune
from autotune_cli.benchmarks import results
from autotune_cli.benchmarks.layer import LayerShape
from mamba_tune import transformers_patch as tp

pytest.importorskip("transformers")
from autotune_cli.benchmarks import model as mb  # noqa: E402  (after the skip: it builds transformers' model)


@pytest.mark.parametrize("args,message", [
    (["--family", "model", "--model-stage", "train"],
     "--model-stage 'train': unknown; known: model_train_step, model_train_step_wall"),
    (["--family", "module", "--model-stage", "model_train_step"], "--model-stage: only with --family model"),
    (["--family", "layer", "--pattern", "M-"], "--pattern: only with --family model"),
    (["--family", "model", "--pattern", "M-X"], "--family model: pattern 'M-X': unknown layer 'X'; one character"),
    (["--family", "model", "--pattern", "*-"], "--family model: pattern '*-': no Mamba-2 layer (M)"),
    (["--family", "model", "--model", "mamba2-2.7b"],
     "--family model: model 'mamba2-2.7b': no attention/MLP dims for it; known: nemotron-h-8b"),
    (["--family", "model", "--tp", "16"], "--tp 16 does not divide nemotron-h-8b's nheads 128 and ngroups 8"),
    (["--family", "model", "--module-stage", "module_fwd_mem_eff"], "--module-stage: only with --family module"),
])
def test_bench_model_rejects_bad_arguments_before_touching_a_gpu(tmp_path, args, message):
    assert_bench_refuses(tmp_path, args, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_bench_model_without_a_gpu_is_a_one_line_error(tmp_path):
    assert_bench_refuses(tmp_path, ["--family", "model"], "no CUDA GPU")
    with pytest.raises(RuntimeError, match="bench_model needs a CUDA GPU"):
        mb.bench_model([], torch.bfloat16)
    with pytest.raises(ValueError, match=r"unknown model stage\(s\) \['x'\]"):
        mb.bench_model([], torch.bfloat16, stages=["x"])


@pytest.mark.parametrize("tp_", [1, 2])
def test_the_model_has_nemotron_h_8bs_dims(tp_):
    """Built on the meta device (no memory): the mixers, attention and MLP of one rank, in the default pattern."""
    s = mb.model_shape("nemotron-h-8b", tp_, 1, 8192)
    m = mb.build_model(s, torch.bfloat16, "meta")
    kinds = [type(b.mixer).__name__ for b in m.model.layers]
    assert kinds == ["NemotronHMamba2Mixer", "NemotronHMLP"] * 3 + ["NemotronHMamba2Mixer", "NemotronHAttention",
                                                                    "NemotronHMLP"]
    mixer = m.model.layers[0].mixer
    assert (mixer.hidden_size, mixer.num_heads, mixer.head_dim, mixer.n_groups, mixer.ssm_state_size,
            mixer.chunk_size) == (4096, 128 // tp_, 64, 8 // tp_, 128, 128)
    assert mixer.in_proj.out_features == s.layer.d_in_proj and mixer.norm.group_size == 8192 // 8
    attn, mlp = m.model.layers[7].mixer, m.model.layers[1].mixer
    assert (attn.q_proj.out_features, attn.k_proj.out_features) == (32 // tp_ * 128, 8 // tp_ * 128)
    assert mlp.up_proj.out_features == 21504 // tp_ and m.lm_head.out_features == mb.VOCAB
    assert m.training and mixer.in_proj.weight.dtype == torch.bfloat16


# hf_tiny's NemotronH dims (8 heads: an in_proj width causal-conv1d accepts), seqlen 40: a partial chunk.
TINY = mb.ModelShape(LayerShape(batch=2, seqlen=40, d_model=32, nheads=8, headdim=16, ngroups=2, dstate=16,
                                chunk_size=16), mb.HybridDims(2, 1, 16, 48), pattern="M*M-", vocab=hf_tiny.VOCAB)


@pytest.fixture
def nemotron_h():
    tp.unpatch_transformers()
    yield {"nemotron_h": importlib.import_module("transformers.models.nemotron_h.modeling_nemotron_h")}
    tp.unpatch_transformers()


def test_the_patched_step_runs_mamba_tunes_kernels_and_gives_the_same_loss(nemotron_h, tmp_path):
    theirs = mb.build_model(TINY, torch.float32, "cpu")
    ours = copy.deepcopy(theirs)
    ids = hf_tiny.tokens()
    record = tmp_path / "calls.json"
    with mb.side(True, ours) as ours_calls, mamba_tune.record_calls(record):
        got = mb.train_step(ours, ids)()
        with pytest.raises(RuntimeError, match="the unpatched side does not run transformers's Mamba-2 functions"):
            with mb.side(False, theirs):
                pass
    assert not mamba_tune.is_transformers_patched()
    with hf_tiny.own_pytorch_path(nemotron_h), mb.side(False, theirs) as base_calls:
        want = mb.train_step(theirs, ids)()
    assert ours_calls["mamba2_split_conv1d_scan_combined"] == "mamba_tune.mamba_split_conv1d_scan_combined"
    assert mb.baseline_name(base_calls) == "transformers (PyTorch)"
    kernels = {c["kernel"] for c in json.loads(record.read_text())["calls"].values()}
    assert {"causal_conv1d_fwd", "ssd_chunk_scan", "gated_norm_fwd", "gated_norm_bwd",
            "ssd_chunk_scan_chunk_state_bwd_dx"} <= kernels, kernels
    assert len(got[1]) == len(list(ours.parameters())) and all(torch.isfinite(g).all() for g in got[1])
    agree = mb.agreement(got, want)
    assert agree["loss_abs_diff"] <= 1e-5 and agree["grad_max_rel_diff"] < 1e-3, agree
    assert mb.ratio_or_note(agree, 1.0, 1.1) == (1.1, None)
    # A model that computes something else gets no ratio (ours' LM head scaled: at init the logits
    # are small and the loss about ln(vocab) whatever the layers do).
    with torch.no_grad():
        ours.lm_head.weight.mul_(50)
    with mb.side(True, ours):
        other = mb.agreement(mb.train_step(ours, ids)(), want)
    assert other["loss_abs_diff"] > other["loss_tol"], other
    ratio, note = mb.ratio_or_note(other, 1.0, 1.1)
    assert ratio is None and note.startswith("no ratio: the losses differ by"), note


def test_results_render_model_rows_against_transformers_and_keep_a_refused_ratio_refused(tmp_path):
    machine = "NVIDIA H100 80GB HBM3 (132 SMs), torch 2.11.0+cu130, triton 3.6.0, helion 1.5.0, mamba-ssm 2.3.2.post1"
    row = {"family": "model", "model": "nemotron-h-8b", "dtype": "bf16", "shape": "batch=1 seqlen=8192",
           "ours_ms": 100.0, "baseline_ms": 102.0, "baseline": "transformers (mamba-ssm)"}
    rows = [{**row, "stage": "model_train_step", "ratio": 1.02, "ours_peak_mib": 900.0, "baseline_peak_mib": 1000.0},
            {**row, "stage": "model_train_step_wall", "ratio": None, "ratio_note": "no ratio: the losses differ"}]
    path = tmp_path / "h100-model-nemotron-h-8b.json"
    path.write_text(json.dumps({"machine": machine, "time": "2026-12-06T12:00:00", "rows": rows}))
    doc = results.render([results.load_file(path)], str(tmp_path))
    assert "### model (H100)" in doc and "| model | row | card | ours | transformers | ratio |" in doc
    assert "| nemotron-h-8b | model_train_step | H100 | 100.000 ms | 102.000 ms | 1.02x |" in doc
    assert "| nemotron-h-8b | model_train_step peak memory | H100 | 900 MiB | 1000 MiB | 1.11x |" in doc
    assert "| nemotron-h-8b | model_train_step_wall | H100 | 100.000 ms | 102.000 ms | - |" in doc


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_bench_runs_end_to_end_on_a_gpu(nemotron_h):
    """The rows at tiny dims (`pytest -m gpu tests/patch/test_bench_model.py`): what the full run
    writes, with both sides run, their losses agreeing and a ratio."""
    s = mb.ModelShape(dataclasses.replace(TINY.layer, batch=4, seqlen=256), TINY.hybrid, TINY.pattern, TINY.vocab)
    rows = mb.bench_model([("tiny", s)], torch.bfloat16, rep_ms=50)
    assert [r["stage"] for r in rows] == list(mb.STAGES)
    for r in rows:
        assert r["loss_abs_diff"] <= r["loss_tol"] and r["ratio"] == r["baseline_ms"] / r["ours_ms"] > 0, r
        assert r["baseline"].startswith("transformers ("), r
        assert all(v.startswith("mamba_tune.") for v in r["ours_calls"].values()), r
    assert rows[0]["ours_peak_mib"] > 0 and rows[0]["baseline_peak_mib"] > 0
    assert not mamba_tune.is_transformers_patched()
