"""transformers' `NemotronHForCausalLM`, patched (these kernels) against unpatched (transformers' own path), in one process.

The model is built from a `NemotronHConfig` alone (no download), seeded, in the benchmark
dtype: the Mamba-2 mixers at a preset's dims (`autotune_cli.presets`: d_model, nheads,
headdim, ngroups, dstate, chunk_size), the attention and MLP blocks at the dims in
`HYBRID_DIMS`, which the presets (Mamba-2 dims only) lack. Nemotron-H 8B's are its public
config's, which are also transformers' `NemotronHConfig` defaults: 32 attention heads, 8
key/value heads of 128 (NoPE GQA), a relu2 MLP of 21504. The layers follow a
`hybrid_override_pattern` (M: Mamba-2 mixer, *: attention, -: MLP); the default, "M-M-M-M*-",
is the first 9 of Nemotron-H 8B's 52 (4 Mamba-2, 4 MLP, 1 attention). The vocabulary is
`VOCAB` (1024, not the checkpoints' 131072): the embedding, the LM head and the loss are the
same on both sides, and at 131072 the LM head alone would be more GEMM work than the 9 layers'
Mamba-2 mixers. Attention is PyTorch's SDPA on both sides.

With `--tp N` it is one rank's model, built without a process group: Mamba-2 heads and
groups, attention and key/value heads and the MLP's intermediate size divided by N (Megatron's
column/row split), d_model whole; the collectives a process group adds are the same on both
sides and left out.

One model is built per shape; ours is a deepcopy of it (the same weights). Patching
(`mamba_tune.patched_transformers(strict=True)`) replaces the functions the mixers look up at
call time, so the same model runs transformers' own path outside it (mamba-ssm's fused
`mamba_split_conv1d_scan_combined` and causal-conv1d's kernels where those packages import,
else transformers' PyTorch code: rows name it in "baseline" and "baseline_calls") and ours
inside it; `side()` checks, before each side runs, that every Mamba-2 function of the model
is mamba-tune's on our side and transformers' own on the other.

The training step: `model(input_ids=ids, labels=ids)` in train mode (the model's own causal-LM
loss, logits in fp32), then the gradient of the loss for every parameter
(`torch.autograd.grad`; no optimizer). Rows (`STAGES`), each with ours_ms, baseline_ms and
ratio (= baseline_ms / ours_ms, > 1: ours faster):
- "model_train_step": do_bench median, L2 flushed; also both sides' peak memory of one step
  above what was allocated before it (MiB);
- "model_train_step_wall": back-to-back steps timed on the host (host time and launch gaps in).
Each row also carries the loss of one step on each side from the same ids, their absolute
difference "loss_abs_diff" and the largest gradient difference relative to the largest
gradient, over the parameters ("grad_max_rel_diff", for information). Where the losses differ
by more than `LOSS_RTOL` of the baseline's loss the sides do not compute the same thing: the
times are kept, the ratio is None and "ratio_note" says why.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Collection, Iterator
from typing import Any

import torch

import mamba_tune
from autotune_cli.benchmarks.common import MODEL_STAGES as STAGES
from autotune_cli.benchmarks.common import check_bench, configs_since, wall_ms
from autotune_cli.benchmarks.layer import WIDTH, LayerShape, layer_shape
from autotune_cli.presets import MODEL_PRESETS
from autotune_cli.timing import gpu_median_ms
from mamba_tune import runtime
from mamba_tune.vocab import dtype_name

MIXER = "NemotronHMamba2Mixer"
PATTERN = "M-M-M-M*-"
PATTERN_CHARS = {"M": "Mamba-2", "*": "attention", "-": "MLP"}
VOCAB = 1024
# Both losses are fp32 means over batch * seqlen tokens of cross-entropies of bf16 logits.
# Rounding differences between two bf16 computations of the same model are unbiased and
# average out over thousands of tokens (the issue measured 5e-5 at loss ~7); a difference of
# half a bf16 ulp of the loss itself (2**-9 relative) is a systematic one: a wrong result.
LOSS_RTOL = 2.0**-9


@dataclasses.dataclass(frozen=True)
class HybridDims:
    """The attention and MLP blocks of a hybrid model (the presets hold only the Mamba-2 mixer)."""

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int


# From each model's public config (Nemotron-H 8B: nvidia/Nemotron-H-8B-Base-8K's config.json,
# equal to transformers' NemotronHConfig defaults).
HYBRID_DIMS: dict[str, HybridDims] = {
    "nemotron-h-8b": HybridDims(num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=21504),
}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """One rank's hybrid model: its Mamba-2 mixers' shape, its attention and MLP dims, its layers."""

    layer: LayerShape
    hybrid: HybridDims
    pattern: str = PATTERN
    vocab: int = VOCAB

    def text(self) -> str:
        h = self.hybrid
        return (f"{self.layer.text()} pattern={self.pattern} attention_heads={h.num_attention_heads} "
                f"kv_heads={h.num_key_value_heads} head_dim={h.head_dim} intermediate={h.intermediate_size} "
                f"vocab={self.vocab}")


def check_pattern(pattern: str) -> None:
    """ValueError unless pattern is a hybrid_override_pattern with at least one Mamba-2 layer."""
    bad = sorted(set(pattern) - set(PATTERN_CHARS))
    if bad or "M" not in pattern:
        raise ValueError(f"pattern {pattern!r}: " + (f"unknown layer {bad[0]!r}" if bad else "no Mamba-2 layer (M)")
                         + "; one character a layer, " + ", ".join(f"{c}: {n}" for c, n in PATTERN_CHARS.items()))


def model_shape(name: str, tp: int, batch: int, seqlen: int, pattern: str = PATTERN) -> ModelShape:
    """A preset's hybrid model on one of tp ranks; ValueError naming what does not fit."""
    if name not in HYBRID_DIMS:
        raise ValueError(f"model {name!r}: no attention/MLP dims for it; known: {', '.join(HYBRID_DIMS)}")
    check_pattern(pattern)
    h = HYBRID_DIMS[name]
    if h.num_attention_heads % tp or h.num_key_value_heads % tp or h.intermediate_size % tp:
        raise ValueError(f"tp={tp} does not divide {name}'s attention heads {h.num_attention_heads}, key/value "
                         f"heads {h.num_key_value_heads} and MLP size {h.intermediate_size}")
    rank = HybridDims(h.num_attention_heads // tp, h.num_key_value_heads // tp, h.head_dim, h.intermediate_size // tp)
    return ModelShape(layer_shape(MODEL_PRESETS[name], tp, batch, seqlen), rank, pattern)


def build_model(s: ModelShape, dtype: torch.dtype, device: str | torch.device, seed: int = 0) -> torch.nn.Module:
    """transformers' NemotronHForCausalLM at s, its own init from `seed`, in train mode.
    ImportError when transformers' NemotronH cannot be imported."""
    from transformers import NemotronHConfig, NemotronHForCausalLM

    m, h = s.layer, s.hybrid
    config = NemotronHConfig(
        vocab_size=s.vocab, hidden_size=m.d_model, hybrid_override_pattern=s.pattern, num_hidden_layers=len(s.pattern),
        num_attention_heads=h.num_attention_heads, num_key_value_heads=h.num_key_value_heads, head_dim=h.head_dim,
        intermediate_size=h.intermediate_size, mlp_hidden_act="relu2", ssm_state_size=m.dstate,
        mamba_num_heads=m.nheads, mamba_head_dim=m.headdim, n_groups=m.ngroups, chunk_size=m.chunk_size,
        conv_kernel=WIDTH, use_cache=False, attn_implementation="sdpa")
    torch.manual_seed(seed)
    with torch.device(device):
        model = NemotronHForCausalLM(config)
    model = model.to(dtype).train()
    for mixer in (x for x in model.modules() if type(x).__name__ == MIXER):
        if (mixer.num_heads, mixer.n_groups, mixer.intermediate_size) != (m.nheads, m.ngroups, m.dim):
            raise ValueError(f"{MIXER} built num_heads={mixer.num_heads} n_groups={mixer.n_groups} "
                             f"intermediate_size={mixer.intermediate_size}, expected {m.nheads}, {m.ngroups}, {m.dim}")
    return model


def train_step(model: torch.nn.Module, ids: torch.Tensor) -> Callable[[], tuple[torch.Tensor, tuple[torch.Tensor, ...]]]:
    """One training step of model on ids: the model's causal-LM loss (labels = ids) and its
    gradient for every parameter."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        loss = model(input_ids=ids, labels=ids).loss
        return loss, torch.autograd.grad(loss, params)

    return step


@contextlib.contextmanager
def side(ours: bool, model: torch.nn.Module) -> Iterator[dict[str, str]]:
    """Run the block with transformers patched (ours) or not (transformers' own path), and check
    it; yields what the model's Mamba-2 mixers call ({function: what runs it}). RuntimeError when
    the process was patched before (MAMBA_TUNE_PATCH_TRANSFORMERS) or a function is not the side's."""
    from mamba_tune import transformers_patch

    ctx = mamba_tune.patched_transformers(strict=True) if ours else contextlib.nullcontext()
    with ctx:
        calls = transformers_patch.mixer_functions(model).get(MIXER, {})
        prefix = "mamba_tune." if ours else "transformers: "
        if (mamba_tune.is_transformers_patched() != ours or not calls
                or not all(v.startswith(prefix) for v in calls.values())):
            raise RuntimeError(f"the {'patched' if ours else 'unpatched'} side does not run "
                               f"{'mamba-tune' if ours else 'transformers'}'s Mamba-2 functions: {calls} "
                               "(patched before the benchmark? unset MAMBA_TUNE_PATCH_TRANSFORMERS)")
        yield calls


def baseline_name(calls: dict[str, str]) -> str:
    """The unpatched side, by what its fused training call runs: mamba-ssm's kernel or transformers' PyTorch."""
    return "transformers (mamba-ssm)" if "mamba_ssm" in calls.get("mamba2_split_conv1d_scan_combined", "") \
        else "transformers (PyTorch)"


def agreement(ours: tuple[torch.Tensor, tuple[torch.Tensor, ...]],
              theirs: tuple[torch.Tensor, tuple[torch.Tensor, ...]]) -> dict[str, float]:
    """Both sides' loss, their difference and the tolerance, and the largest gradient difference
    relative to the largest gradient of its parameter (max over parameters)."""
    loss_o, loss_t = float(ours[0].detach()), float(theirs[0].detach())
    rel = max(float((go.float() - gt.float()).abs().max() / gt.float().abs().max().clamp_min(1e-30))
              for go, gt in zip(ours[1], theirs[1], strict=True))
    return {"ours_loss": loss_o, "baseline_loss": loss_t, "loss_abs_diff": abs(loss_o - loss_t),
            "loss_tol": LOSS_RTOL * abs(loss_t), "grad_max_rel_diff": rel}


def ratio_or_note(agree: dict[str, float], ours_ms: float, baseline_ms: float) -> tuple[float | None, str | None]:
    """baseline_ms / ours_ms where the sides' losses agree (`agreement`), else None and why."""
    if agree["loss_abs_diff"] <= agree["loss_tol"]:
        return baseline_ms / ours_ms, None
    return None, (f"no ratio: the losses differ by {agree['loss_abs_diff']:.3e} > {agree['loss_tol']:.3e} "
                  "(2**-9 of the baseline's loss)")


def _timer(kind: str, rep_ms: int) -> Callable[[Callable[[], Any]], float]:
    if kind.endswith("_wall"):
        return lambda fn: wall_ms(fn, 5)
    return lambda fn: gpu_median_ms(fn, rep_ms, warmup_ms=max(rep_ms // 8, 5))


def _bench_shape(label: str, s: ModelShape, dtype: torch.dtype, rep_ms: int, stages: Collection[str],
                 device: str = "cuda") -> list[dict[str, Any]]:
    from autotune_cli.benchmarks.ssd import peak_mib

    sources = runtime.resolutions()
    theirs = build_model(s, dtype, device)
    ours = copy.deepcopy(theirs)
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(0, s.vocab, (s.layer.batch, s.layer.seqlen), generator=gen, device=device)
    fn_ours, fn_base = train_step(ours, ids), train_step(theirs, ids)
    with side(True, ours) as ours_calls:
        got = fn_ours()
    with side(False, theirs) as base_calls:
        want = fn_base()
    agree = agreement(got, want)
    del got, want
    rows = []
    for kind in [k for k in STAGES if k in stages]:
        timer = _timer(kind, rep_ms)
        row: dict[str, Any] = {"family": "model", "model": label, "stage": kind, "dtype": dtype_name(dtype),
                               "shape": s.text(), "pattern": s.pattern, "ours_ms": None, "baseline_ms": None,
                               "ratio": None, "baseline": baseline_name(base_calls), **agree,
                               "ours_calls": ours_calls, "baseline_calls": base_calls}
        with side(True, ours):
            row["ours_ms"] = timer(fn_ours)
            if kind == "model_train_step":
                row["ours_peak_mib"] = peak_mib(fn_ours)
        with side(False, theirs):
            row["baseline_ms"] = timer(fn_base)
            if kind == "model_train_step":
                row["baseline_peak_mib"] = peak_mib(fn_base)
        row["ratio"], note = ratio_or_note(agree, row["ours_ms"], row["baseline_ms"])
        if note is not None:
            row["ratio_note"] = note
        rows.append(row)
    configs = configs_since(sources)
    for row in rows:
        row["configs"] = configs
    return rows


def bench_model(shapes: list[tuple[str, ModelShape]], dtype: torch.dtype, rep_ms: int = 2000,
                stages: Collection[str] = STAGES) -> list[dict[str, Any]]:
    """Time the model rows (default: all of `STAGES`) patched vs unpatched at each (label, shape).
    CUDA only. rep_ms: do_bench's repetition time (a step at Nemotron-H 8B b1 L8192: about 60 TFLOP of GEMMs, ~100 ms)."""
    check_bench("model", "model", stages, STAGES)
    rows = []
    for label, shape in shapes:
        rows += _bench_shape(label, shape, dtype, rep_ms, stages)
        torch.cuda.empty_cache()
    return rows
