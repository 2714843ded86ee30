"""Sweep specs: the shipped specs are valid; every kind of bad input is one line naming
the file, the line and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune_cli.plan import plan
from autotune_cli.spec import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parent.parent

GOOD = """\
name: t
target:
  gpu: h200
  arch: sm90
models:
  - preset: nemotron-3-nano-30b
    tp: [1, 2]
  - name: custom
    dims: {d_inner: 1024, headdim: 64, ngroups: 2, dstate: 64, chunk_size: 64}
    seqlen: [1024]
batch: [2]
seqlen: [8192, 4096]
dtypes: [bf16]
kernels: [gated_norm_fwd, gated_norm_bwd]
budget:
  effort: quick
  seconds_per_combo: 60
  seed: 3
tolerances:
  bf16: {atol: 0.02}
"""


def _bad(old: str, new: str) -> str:
    assert old in GOOD, old
    return GOOD.replace(old, new, 1)


def test_shipped_specs_are_valid():
    specs = sorted((ROOT / "sweeps").glob("*.yaml"))
    assert {p.stem for p in specs} >= {"nemotron-nano", "nemotron-h-8b", "nemotron-h-47b", "mamba2-2.7b",
                                       "zamba2-2.7b", "falcon-h1-0.5b"}
    for p in specs:
        spec = load_spec(p)
        assert spec.name == p.stem
        assert plan(spec)


def test_nemotron_nano_spec_covers_tp_and_seqlens():
    spec = load_spec(ROOT / "sweeps/nemotron-nano.yaml")
    assert spec.target.gpu == "h200"
    assert sorted((m.tp, m.nheads, m.ngroups) for m in spec.models) == [(1, 64, 8), (2, 32, 4)]
    assert all(m.batch == [2] and 8192 in m.seqlen and len(m.seqlen) >= 2 for m in spec.models)
    assert spec.dtypes == ["bf16"]


def test_good_spec_resolves_presets_tp_and_explicit_dims():
    spec = parse_spec(GOOD, source="good.yaml")
    assert spec.name == "t" and spec.budget.seed == 3 and spec.budget.seconds_per_combo == 60
    nano = [m for m in spec.models if m.name == "nemotron-3-nano-30b"]
    assert [(m.tp, m.nheads, m.ngroups) for m in nano] == [(1, 64, 8), (2, 32, 4)]
    (custom,) = [m for m in spec.models if m.name == "custom"]
    assert (custom.nheads, custom.headdim, custom.seqlen, custom.batch) == (16, 64, [1024], [2])
    assert spec.tolerances["bf16"].atol == 0.02 and spec.tolerances["bf16"].factor == 2.0
    assert spec.tolerances["fp32"].atol > 0  # defaults fill the dtypes not given


def test_packed_sequences_add_seq_idx_combos_only_where_a_kernel_depends_on_it():
    base = GOOD.replace("kernels: [gated_norm_fwd, gated_norm_bwd]", "kernels: all")
    plain = plan(parse_spec(base, source="t.yaml"))
    packed = plan(parse_spec(base.replace("dtypes: [bf16]", "packed_sequences: [false, true]\ndtypes: [bf16]"),
                             source="t.yaml"))
    assert all(c.dims.get("has_seq_idx", 0) == 0 for c in plain)
    new = {c.key for c in packed} - {c.key for c in plain}
    with_seq_idx = {"ssd_chunk_state", "ssd_state_passing", "ssd_chunk_state_passing", "ssd_chunk_scan",
                    "ssd_chunk_state_passing_bwd", "ssd_chunk_scan_chunk_state_bwd_dx", "ssd_chunk_state_scan_bwd_dbdc"}
    assert {c.kernel for c in packed if c.key in new} == with_seq_idx
    assert all(c.dims["has_seq_idx"] == 1 for c in packed if c.key in new)
    assert len(new) == len(with_seq_idx) * sum(len(m.batch) * len(m.seqlen) for m in parse_spec(base, source="t.yaml").models)
    # Kernels without seq_idx in their key (norm, F1, F4) keep one combo, now from both origins.
    (bmm,) = [c for c in packed if c.kernel == "ssd_bmm" and c.dims["ngroups"] == 8 and c.dims["seqlen"] == 8192]
    assert bmm.origins == ("nemotron-3-nano-30b tp=1 batch=2 seqlen=8192",
                           "nemotron-3-nano-30b tp=1 batch=2 seqlen=8192 packed")


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param(_bad("  arch: sm90\n", "  arch: sm90\n  colour: red\n"), "t.yaml:5: target.colour: unknown key",
                     id="unknown-key"),
        pytest.param(_bad("seqlen: [8192, 4096]", "seqlen: [8192, long]"),
                     "t.yaml:12: seqlen[1]: Input should be a valid integer", id="wrong-type"),
        pytest.param(_bad("d_inner: 1024, headdim: 64", "d_inner: 1000, headdim: 64"),
                     "t.yaml:9: models[1].dims.headdim: headdim 64 does not divide d_inner 1000", id="headdim"),
        pytest.param(_bad("preset: nemotron-3-nano-30b", "preset: nemotron-4"),
                     "t.yaml:6: models[0].preset: unknown preset 'nemotron-4'", id="unknown-preset"),
        pytest.param(_bad("tp: [1, 2]", "tp: [1, 3]"),
                     "t.yaml:7: models[0].tp[1]: tp 3 must divide nheads 64 and ngroups 8", id="tp"),
        pytest.param(_bad("gpu: h200", "gpu: h900"), "t.yaml:3: target.gpu: unknown GPU 'h900'", id="gpu"),
        pytest.param(_bad("arch: sm90", "arch: sm100"), "t.yaml:4: target.arch: h200 is sm90, not sm100",
                     id="arch"),
        pytest.param(_bad("kernels: [gated_norm_fwd, gated_norm_bwd]", "kernels: [gated_norm_fwd, flash_attn]"),
                     "t.yaml:14: kernels[1]: unknown kernel 'flash_attn'", id="unknown-kernel"),
        pytest.param(_bad("dtypes: [bf16]", "dtypes: [bf16, int8]"), "t.yaml:13: dtypes[1]: Input should be",
                     id="dtype"),
        pytest.param(_bad("  effort: quick", "  effort: heroic"), "t.yaml:16: budget.effort: Input should be",
                     id="effort"),
        pytest.param(_bad("  seconds_per_combo: 60", "  seconds_per_combo: -5"),
                     "t.yaml:17: budget.seconds_per_combo: Input should be greater than 0", id="negative"),
        pytest.param(_bad("batch: [2]\n", ""), "t.yaml:1: batch: required key is missing", id="missing"),
        pytest.param(_bad("batch: [2]\n", "batch: [2]\nbatch: [4]\n"), "t.yaml:12: invalid YAML: duplicate key 'batch'",
                     id="duplicate-key"),
        pytest.param(_bad("models:\n", "models: [\n"), "t.yaml:", id="invalid-yaml"),
        pytest.param("- just\n- a list\n", "t.yaml:1: a spec is a YAML mapping, got list", id="not-a-mapping"),
        pytest.param(_bad("  - name: custom\n", "  - name: nemotron-3-nano-30b\n"),
                     "t.yaml:8: models[1].name: model name 'nemotron-3-nano-30b' already used", id="dup-model"),
        pytest.param(_bad("  - preset: nemotron-3-nano-30b\n", "  - dims: {headdim: 64, ngroups: 1, dstate: 1, "
                          "chunk_size: 1, nheads: 2}\n    preset: nemotron-3-nano-30b\n"),
                     "t.yaml:6: models[0]: give exactly one of 'preset' or 'dims'", id="preset-and-dims"),
        pytest.param(_bad("dtypes: [bf16]", "packed_sequences: [false, false]\ndtypes: [bf16]"),
                     "t.yaml:13: packed_sequences: duplicate values [False, False]", id="packed-dup"),
        pytest.param(_bad("dtypes: [bf16]", "packed_sequences: [yes please]\ndtypes: [bf16]"),
                     "t.yaml:13: packed_sequences[0]: Input should be a valid boolean", id="packed-type"),
        pytest.param(_bad("  seed: 3\n", "  seed: 3\n  algorithm: Grid\n"),
                     "t.yaml:19: budget.algorithm: unknown search algorithm 'Grid'", id="algorithm"),
    ],
)
def test_bad_spec_is_one_line_with_file_line_and_field(text, expected):
    with pytest.raises(SpecError) as e:
        parse_spec(text, source="t.yaml")
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith(expected), message


def test_yaml_tags_are_not_executed(tmp_path):
    p = tmp_path / "evil.yaml"
    p.write_text("name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(SpecError, match="evil.yaml:1: invalid YAML"):
        load_spec(p)


def test_missing_file():
    with pytest.raises(SpecError, match="nope.yaml: cannot read"):
        load_spec("nope.yaml")
