"""Tiny random transformers models with a Mamba-2 mixer (no download), for the transformers patch tests.

Each is built from a config alone: two to four layers, hidden size 32, 4 heads of 16 in 2
groups, dstate 16, chunk_size 16 (mamba-tune's smallest), so that a sequence of 40 tokens
spans two full chunks and a partial one.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import torch

VOCAB = 64
SEQLEN = 40


def mamba2() -> torch.nn.Module:
    from transformers import Mamba2Config, Mamba2ForCausalLM

    return Mamba2ForCausalLM(Mamba2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, state_size=16, expand=2, head_dim=16, num_heads=4,
        n_groups=2, chunk_size=16, conv_kernel=4))


def nemotron_h() -> torch.nn.Module:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    # M: Mamba-2 mixer, *: attention, -: MLP (the checkpoints' hybrid_override_pattern).
    # 8 heads: the in_proj output is 2 * 128 + 2 * 2 * 16 + 8 = 328 wide, a multiple of 8, which
    # the causal-conv1d package needs of the channel-last conv input NemotronH hands it (with
    # 4 heads, 196, its own path raised on the H200 where causal-conv1d is installed).
    return NemotronHForCausalLM(NemotronHConfig(
        vocab_size=VOCAB, hidden_size=32, hybrid_override_pattern="M*M-", num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, intermediate_size=48, ssm_state_size=16, mamba_num_heads=8,
        mamba_head_dim=16, n_groups=2, chunk_size=16))


def zamba2() -> torch.nn.Module:
    from transformers import Zamba2Config, Zamba2ForCausalLM

    return Zamba2ForCausalLM(Zamba2Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
        mamba_d_state=16, mamba_headdim=16, n_mamba_heads=4, mamba_ngroups=2, mamba_expand=2, chunk_size=16,
        num_attention_heads=2, num_key_value_heads=2, attention_head_dim=16, intermediate_size=48,
        num_mem_blocks=1))


def falcon_h1() -> torch.nn.Module:
    from transformers import FalconH1Config, FalconH1ForCausalLM

    return FalconH1ForCausalLM(FalconH1Config(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=16, intermediate_size=48, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=2,
        mamba_d_state=16, mamba_chunk_size=16, mamba_rms_norm=True, mamba_norm_before_gate=False))


# model_type -> builder; the two the patch is for first.
MODELS: dict[str, Callable[[], torch.nn.Module]] = {
    "mamba2": mamba2,
    "nemotron_h": nemotron_h,
    "zamba2": zamba2,
    "falcon_h1": falcon_h1,
}


def tokens(batch: int = 2, seqlen: int = SEQLEN, seed: int = 0, device: str = "cpu") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (batch, seqlen), generator=g).to(device)


@contextlib.contextmanager
def own_pytorch_path(mods: dict[str, ModuleType]) -> Iterator[None]:
    """The models' own path as it runs on a CPU: transformers' PyTorch code. Where mamba-ssm was
    importable when a modeling module was imported (another test made its pure-Python modules
    importable), transformers picked mamba-ssm's Triton functions, which need a GPU; for the
    block, each such function is transformers' decorated PyTorch function again."""
    from mamba_tune import transformers_patch as tp

    legacy = tp._is_legacy(importlib.import_module("transformers").__version__)
    swapped: list[tuple[ModuleType, str, Any]] = []
    for module in mods.values():
        for tf_name in tp._functions(legacy):
            original = vars(module).get(tf_name)
            torch_function = getattr(tp._inner(original), "__wrapped__", None)
            if original is None or torch_function is None or tp._resolved(original) == "transformers' PyTorch code":
                continue
            swapped.append((module, tf_name, original))
            setattr(module, tf_name, torch_function)
    try:
        yield
    finally:
        for module, tf_name, original in swapped:
            setattr(module, tf_name, original)
