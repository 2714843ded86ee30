"""transformers' Mamba-2 models on a CUDA GPU, patched against their own path
(`pytest -m gpu -s tests/patch/test_transformers_patch_gpu.py`).

Their own path is what transformers picked: mamba-ssm's and causal-conv1d's kernels where
those import, else its PyTorch code. Bound, as in test_patch_gpu.py: in bf16,
err(patched) <= 2 * err(their own path) + atol, both against their own path in fp32 from the
same weights. A function mamba-tune does not have yet runs transformers' own in the patched
model too (with a warning), so the bound then covers the provided ones.
"""

from __future__ import annotations

import contextlib
import copy
import statistics
import warnings

import hf_tiny
import pytest
import torch

import mamba_tune
from mamba_tune import transformers_patch as tp
from mamba_tune.runtime import MambaTuneWarning

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("transformers")

STEPS = 3


@pytest.fixture(autouse=True)
def _unpatched():
    tp.unpatch_transformers()
    yield
    tp.unpatch_transformers()


def _err(a: torch.Tensor, ref: torch.Tensor) -> float:
    return (a.float() - ref.float()).abs().max().item()


def _assert_bounded(name: str, ours: torch.Tensor, theirs: torch.Tensor, ref: torch.Tensor, atol: float) -> None:
    assert torch.isfinite(ours).all(), f"{name}: not finite"
    err, bound = _err(ours, ref), 2 * _err(theirs, ref) + atol
    assert err <= bound, f"{name}: max error {err:.3e} > 2 * their own path's error + atol = {bound:.3e}"


def _train(model: torch.nn.Module, batches: list[torch.Tensor], patched: bool) -> tuple[list[float], dict]:
    """STEPS AdamW steps; the losses and the first step's gradients."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads = [], {}
    with (mamba_tune.patched_transformers() if patched else contextlib.nullcontext()), warnings.catch_warnings():
        warnings.simplefilter("ignore", MambaTuneWarning)  # functions not provided yet: transformers' own
        for step, ids in enumerate(batches):
            loss = model(ids, labels=ids).loss
            loss.backward()
            if step == 0:
                grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    return losses, grads


@pytest.mark.parametrize("model_type", ["mamba2", "nemotron_h"])
def test_training_steps_match_the_models_own_path(model_type):
    torch.manual_seed(0)
    base = hf_tiny.MODELS[model_type]().cuda().train()
    batches = [hf_tiny.tokens(batch=4, seqlen=256, seed=s, device="cuda") for s in range(STEPS)]
    ref_losses, ref_grads = _train(copy.deepcopy(base).float(), batches, patched=False)
    their_losses, their_grads = _train(copy.deepcopy(base).bfloat16(), batches, patched=False)
    our_losses, our_grads = _train(copy.deepcopy(base).bfloat16(), batches, patched=True)
    print(f"\n{model_type} losses: fp32 {ref_losses}, theirs bf16 {their_losses}, ours bf16 {our_losses}")
    for step in range(STEPS):
        _assert_bounded(f"loss at step {step}", torch.tensor(our_losses[step]), torch.tensor(their_losses[step]),
                        torch.tensor(ref_losses[step]), atol=2e-2)
    assert set(our_grads) == set(ref_grads)
    # Every gradient's errors first (printed with -s), then the bound on each.
    print(f"{model_type} first-step gradients, max error vs fp32: ours / their own path (bf16)")
    for name, ref in ref_grads.items():
        print(f"  {name}: {_err(our_grads[name], ref):.3e} / {_err(their_grads[name], ref):.3e} "
              f"(max |fp32| {ref.abs().max().item():.3e})")
    for name, ref in ref_grads.items():
        _assert_bounded(f"grad {name}", our_grads[name], their_grads[name], ref, atol=1e-2 * ref.abs().max().item())


@pytest.mark.parametrize("model_type", ["mamba2", "nemotron_h"])
def test_inference_forward_matches_and_its_time(model_type):
    """A larger model than the tiny ones: timing means little at hidden size 32."""
    torch.manual_seed(0)
    base = _larger(model_type).cuda().eval()
    ids = hf_tiny.tokens(batch=2, seqlen=2048, device="cuda")
    with torch.no_grad():
        ref = base(ids).logits
        theirs_model = copy.deepcopy(base).bfloat16()
        theirs, their_ms = _out_and_ms(theirs_model, ids)
        with mamba_tune.patched_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore", MambaTuneWarning)
            ours, our_ms = _out_and_ms(theirs_model, ids)  # the same module objects, patched
    print(f"\n{model_type} forward (bf16, batch 2 x 2048, {torch.cuda.get_device_name()}): "
          f"their own path {their_ms:.2f} ms, patched {our_ms:.2f} ms ({their_ms / our_ms:.2f}x); "
          f"patched mixers call {tp.mixer_functions(theirs_model)}")
    _assert_bounded("logits", ours, theirs, ref, atol=5e-2)


def _out_and_ms(model: torch.nn.Module, ids: torch.Tensor, reps: int = 10) -> tuple[torch.Tensor, float]:
    out = model(ids).logits  # the first call compiles the kernels
    model(ids)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        model(ids)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return out, statistics.median(times)


def _larger(model_type: str) -> torch.nn.Module:
    """Nemotron-3 Nano's mixer dims per layer (64 heads of 64, 8 groups, dstate 128), fewer layers."""
    if model_type == "mamba2":
        from transformers import Mamba2Config, Mamba2ForCausalLM

        return Mamba2ForCausalLM(Mamba2Config(
            vocab_size=hf_tiny.VOCAB, hidden_size=2048, num_hidden_layers=2, state_size=128, expand=2, head_dim=64,
            num_heads=64, n_groups=8, chunk_size=128))
    from transformers import NemotronHConfig, NemotronHForCausalLM

    # One attention layer: with Mamba layers only, transformers 5's eval forward raises in
    # `get_seq_length` (its cache then holds no attention layer; seen on the H200).
    return NemotronHForCausalLM(NemotronHConfig(
        vocab_size=hf_tiny.VOCAB, hidden_size=2048, hybrid_override_pattern="M*M-", intermediate_size=4096,
        num_attention_heads=16, num_key_value_heads=2, head_dim=128, ssm_state_size=128, mamba_num_heads=64,
        mamba_head_dim=64, n_groups=8, chunk_size=128))
