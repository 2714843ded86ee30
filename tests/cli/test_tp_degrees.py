"""Tensor-parallel degrees 4 and 8: accepted where they divide a preset's heads and groups."""

from __future__ import annotations

import pytest

from autotune_cli.plan import plan
from autotune_cli.presets import MODEL_PRESETS, tp_degrees
from autotune_cli.spec import SpecError, parse_spec
from mamba_tune.keys import split_state_passing_bwd, two_pass_dbdc


def _spec(preset: str, tp: list[int]) -> str:
    return (f"target: {{gpu: h200}}\nmodels:\n  - preset: {preset}\n    tp: {tp}\n"
            "batch: [2]\nseqlen: [8192]\ndtypes: [bf16]\n")


def test_tp_degrees_per_preset():
    # The degrees README's spec section lists.
    assert {name: tp_degrees(d) for name, d in MODEL_PRESETS.items()} == {
        "nemotron-3-nano-30b": [1, 2, 4, 8],
        "nemotron-h-8b": [1, 2, 4, 8],
        "nemotron-h-47b": [1, 2, 4, 8],
        "nemotron-h-56b": [1, 2, 4, 8],
        "mamba2-2.7b": [1],
        "zamba2-2.7b": [1],
        "falcon-h1-0.5b": [1],
    }


@pytest.mark.parametrize("preset", ["nemotron-3-nano-30b", "nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b"])
def test_tp_4_and_8_resolve_and_plan(preset):
    dims = MODEL_PRESETS[preset]
    spec = parse_spec(_spec(preset, [4, 8]))
    assert [(m.tp, m.nheads, m.ngroups) for m in spec.models] == [
        (4, dims.nheads // 4, dims.ngroups // 4), (8, dims.nheads // 8, dims.ngroups // 8)]
    combos = plan(spec)
    norm = {c.dims["d"] for c in combos if c.kernel == "gated_norm_fwd"}
    assert norm == {dims.nheads * dims.headdim // 4, dims.nheads * dims.headdim // 8}
    # Every kernel has a combo at both degrees (TP 8 leaves one group per rank), but for two
    # pairs of alternatives, each picked per shape by its rule: the state-passing backward's one
    # walk or split walk (batch * nheads < 64 or chunk 256), and dB/dC's one kernel or two passes
    # (dstate >= 256: 47B and 56B). The split walk runs F2's kernel too (`runs_too`), which
    # `kernels: all` leaves out otherwise (the forward runs F2 + F3 fused).
    walks = {"ssd_chunk_state_passing_bwd", "ssd_state_passing_bwd"}
    one = {"ssd_chunk_state_scan_bwd_dbdc"}
    two = {"ssd_chunk_state_scan_bwd_dcb", "ssd_bmm_bwd_dbdc"}
    for tp in (4, 8):
        kernels = {c.kernel for c in combos if any(f"tp={tp} " in o for o in c.origins)}
        split = split_state_passing_bwd(2, dims.nheads // tp, dims.chunk_size)
        assert kernels & walks == {"ssd_state_passing_bwd" if split else "ssd_chunk_state_passing_bwd"}, tp
        assert kernels & (one | two) == (two if two_pass_dbdc(dims.dstate) else one), tp
        assert ("ssd_chunk_state" in kernels) == split, tp
        assert kernels - walks - one - two - {"ssd_chunk_state"} == set(spec.kernels) - walks - one - two, tp


@pytest.mark.parametrize("preset,tp", [("mamba2-2.7b", 2), ("zamba2-2.7b", 4), ("falcon-h1-0.5b", 8),
                                       ("nemotron-3-nano-30b", 16)])
def test_tp_that_does_not_divide_is_one_line(preset, tp):
    dims = MODEL_PRESETS[preset]
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(preset, [1, tp]), source="s.yaml")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"s.yaml:4: models[0].tp[1]: tp {tp} must divide"), msg
    assert f"nheads {dims.nheads}" in msg and f"ngroups {dims.ngroups}" in msg
