"""Sweep specs: the shipped specs are valid; every kind of bad input is one line naming
the file, the line and the field."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune_cli.plan import plan
from autotune_cli.spec import SpecError, load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]

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
    assert not (ROOT / "sweeps/planned").exists()  # one spec per model: its shipped part is a section
    for p in specs:
        spec = load_spec(p)
        # A model's spec names the part of its sweep that the h200 and the h100 bundle hold; a spec
        # of a few models' other shapes (short sequences), the part of the SKUs that tuned it.
        assert spec.shipped_skus, p.stem
        if len({m.name for m in spec.models}) == 1:
            assert spec.shipped_skus == ["h200", "h100"], p.stem
        full = {c.key for c in plan(spec)}
        for sku in spec.shipped_skus:
            shipped = load_spec(p, shipped=True, gpu=sku)
            assert (shipped.name, shipped.target.gpu) == (p.stem, sku)
            part = {c.key for c in plan(shipped)}  # all of it once a SKU has tuned every combo
            assert part and part <= full, (p.stem, sku)
        assert load_spec(p, shipped=True) == load_spec(p, shipped=True, gpu=spec.target.gpu)


def test_nemotron_nano_spec_covers_tp_and_seqlens():
    spec = load_spec(ROOT / "sweeps/nemotron-nano.yaml")
    assert spec.target.gpu == "h200"
    assert sorted((m.tp, m.nheads, m.ngroups) for m in spec.models) == [(1, 64, 8), (2, 32, 4), (4, 16, 2), (8, 8, 1)]
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
    # `kernels: all` is the default path's: not F2 alone nor the parallel scan (the forward runs them
    # fused; the split walk's F2 call has no seq_idx), nor the conv1d backward's two kernels (the layer's
    # channel-last calls run the slide kernel).
    with_seq_idx = {"causal_conv1d_fwd", "causal_conv1d_bwd_slide", "ssd_chunk_state_passing",
                    "ssd_chunk_scan", "ssd_chunk_state_passing_bwd", "ssd_state_passing_bwd", "ssd_chunk_scan_chunk_state_bwd_dx",
                    "ssd_chunk_state_scan_bwd_dbdc"}
    assert {c.kernel for c in packed if c.key in new} == with_seq_idx
    assert all(c.dims["has_seq_idx"] == 1 for c in packed if c.key in new)
    # B2 + B3 is one of two kernels at each shape (the custom model's 16 heads: the split walk).
    assert {c.dims["nheads"] for c in packed if c.kernel == "ssd_state_passing_bwd"} == {16}
    assert len(new) == (len(with_seq_idx) - 1) * sum(len(m.batch) * len(m.seqlen) for m in parse_spec(base, source="t.yaml").models)
    # Kernels without seq_idx in their key (norm, F1, F4) keep one combo, now from both origins.
    (bmm,) = [c for c in packed if c.kernel == "ssd_bmm" and c.dims["ngroups"] == 8 and c.dims["seqlen"] == 8192]
    assert bmm.origins == ("nemotron-3-nano-30b tp=1 batch=2 seqlen=8192",
                           "nemotron-3-nano-30b tp=1 batch=2 seqlen=8192 packed")


def test_norm_weight_dtypes_add_low_precision_weight_norm_combos_only():
    base = GOOD.replace("kernels: [gated_norm_fwd, gated_norm_bwd]", "kernels: all")
    assert parse_spec(base, source="t.yaml").norm_weight_dtypes == ["fp32"]
    plain = plan(parse_spec(base, source="t.yaml"))
    both = plan(parse_spec(base.replace("dtypes: [bf16]", "dtypes: [bf16]\nnorm_weight_dtypes: [fp32, bf16]"),
                           source="t.yaml"))
    assert all(c.dims["weight_fp32"] == 1 for c in plain if c.kernel.startswith("gated_norm"))
    new = [c for c in both if c.key not in {p.key for p in plain}]
    assert {c.kernel for c in new} == {"gated_norm_fwd", "gated_norm_bwd"}
    assert all(c.dims["weight_fp32"] == 0 and c.dtype == "bf16" for c in new)
    # one per norm shape: the same shapes as the fp32-weight combos
    assert sorted((c.kernel, c.dims["rows"], c.dims["d"]) for c in new) == sorted(
        (c.kernel, c.dims["rows"], c.dims["d"]) for c in plain if c.kernel.startswith("gated_norm"))
    assert all(o.endswith(" norm_weight=bf16") for c in new for o in c.origins)
    # The SSD combos do not change, nor their origins.
    ssd = {c.key: c.origins for c in both if c.kernel.startswith("ssd_")}
    assert ssd == {c.key: c.origins for c in plain if c.kernel.startswith("ssd_")}
    only_low = plan(parse_spec(base.replace("dtypes: [bf16]", "dtypes: [bf16]\nnorm_weight_dtypes: [bf16]"),
                               source="t.yaml"))
    assert {c.key for c in only_low} == {c.key for c in both} - {c.key for c in plain
                                                                 if c.kernel.startswith("gated_norm")}


def test_a_low_precision_norm_weight_serves_only_its_own_dtype():
    text = GOOD.replace("dtypes: [bf16]", "dtypes: [bf16, fp16]\nnorm_weight_dtypes: [fp32, fp16]")
    combos = [c for c in plan(parse_spec(text, source="t.yaml")) if c.kernel == "gated_norm_fwd"]
    assert {(c.dtype, c.dims["weight_fp32"]) for c in combos} == {("bf16", 1), ("fp16", 1), ("fp16", 0)}


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param(_bad("dtypes: [bf16]", "dtypes: [bf16]\nnorm_weight_dtypes: [fp32, fp16]"),
                     "t.yaml:14: norm_weight_dtypes[1]: fp16 is neither fp32 nor one of dtypes ['bf16']",
                     id="weight-not-a-dtype"),
        pytest.param(_bad("dtypes: [bf16]", "dtypes: [bf16]\nnorm_weight_dtypes: [bf16, bf16]"),
                     "t.yaml:14: norm_weight_dtypes[1]: bf16 listed twice", id="weight-dup"),
        pytest.param(_bad("dtypes: [bf16]", "dtypes: [bf16, fp16]\nnorm_weight_dtypes: [bf16]"),
                     "t.yaml:14: norm_weight_dtypes: dtype fp16 gets no norm weight dtype: list fp32 or fp16",
                     id="dtype-without-weight"),
        pytest.param(_bad("dtypes: [bf16]", "dtypes: [bf16]\nnorm_weight_dtypes: [fp64]"),
                     "t.yaml:14: norm_weight_dtypes[0]: Input should be", id="weight-type"),
    ],
)
def test_bad_norm_weight_dtypes(text, expected):
    with pytest.raises(SpecError, match=re.escape(expected)):
        parse_spec(text, source="t.yaml")


@pytest.mark.parametrize(
    "text,expected",
    [
        pytest.param(_bad("  arch: sm90\n", "  arch: sm90\n  colour: red\n"),
                     "t.yaml:5: target.colour: unknown key 'colour'; known keys here: gpu, arch", id="unknown-key"),
        # A typo in a required key: the typo is named, with the key it is close to (not "batch: missing").
        pytest.param(_bad("batch: [2]\n", "bacth: [2]\n"), "t.yaml:11: bacth: unknown key 'bacth'; did you mean 'batch'?",
                     id="typo-required-key"),
        pytest.param(_bad("  seed: 3\n", "  seed: 3\n  seconds_per_comb: 5\n"),
                     "t.yaml:19: budget.seconds_per_comb: unknown key 'seconds_per_comb'; did you mean "
                     "'seconds_per_combo'?", id="typo-nested-key"),
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
        pytest.param(_bad("  - preset: nemotron-3-nano-30b\n", "  - dims: {headdim: 64, ngroups: 1, dstate: 16, "
                          "chunk_size: 16, nheads: 2}\n    preset: nemotron-3-nano-30b\n"),
                     "t.yaml:6: models[0]: give exactly one of 'preset' or 'dims'", id="preset-and-dims"),
        pytest.param(_bad("dtypes: [bf16]", "packed_sequences: [false, false]\ndtypes: [bf16]"),
                     "t.yaml:13: packed_sequences: duplicate values [False, False]", id="packed-dup"),
        pytest.param(_bad("dtypes: [bf16]", "packed_sequences: [yes please]\ndtypes: [bf16]"),
                     "t.yaml:13: packed_sequences[0]: Input should be a valid boolean", id="packed-type"),
        pytest.param(_bad("  seed: 3\n", "  seed: 3\n  algorithm: Grid\n"),
                     "t.yaml:19: budget.algorithm: unknown search algorithm 'Grid'", id="algorithm"),
        pytest.param(_bad("name: t", "name: ../../escape"), "t.yaml:1: name: '../../escape' is not a safe file name",
                     id="name-escapes"),
        pytest.param(_bad("name: t", "name: /tmp/abs"), "t.yaml:1: name: '/tmp/abs' is not a safe file name",
                     id="name-absolute"),
        pytest.param(_bad("name: t", 'name: "a\\0b"'), "t.yaml:1: name: 'a\\x00b' is not a safe file name",
                     id="name-nul"),
        pytest.param(_bad("name: t", "name: a..b"), "t.yaml:1: name: 'a..b' is not a safe file name", id="name-dots"),
        pytest.param(_bad("chunk_size: 64}", "chunk_size: 48}"),
                     "t.yaml:9: models[1].dims.chunk_size: chunk_size=48: the kernels need a power of two in 16..256",
                     id="chunk-not-pow2"),
        pytest.param(_bad("chunk_size: 64}", "chunk_size: 8}"), "t.yaml:9: models[1].dims.chunk_size: chunk_size=8",
                     id="chunk-small"),
        pytest.param(_bad("dstate: 64", "dstate: 100000"), "t.yaml:9: models[1].dims.dstate: dstate=100000: at most 256",
                     id="dstate"),
        pytest.param(_bad("d_inner: 1024, headdim: 64", "d_inner: 4096, headdim: 1024"),
                     "t.yaml:9: models[1].dims.headdim: headdim=1024: at most 256", id="headdim-limit"),
        pytest.param(_bad("batch: [2]", "batch: [100000]"),
                     "t.yaml:6: models[0]: tp 1 batch 100000 seqlen 8192: x (batch, seqlen, nheads, headdim) has "
                     "3,355,443,200,000 elements, over 2**31 - 1", id="overflow"),
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


BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join(['*' + p] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text,expected", [
    pytest.param(BOMB, "t.yaml: over 10,000 YAML nodes once aliases are expanded", id="alias-bomb"),
    pytest.param("a: " + "[" * 5000 + "]" * 5000 + "\n", "t.yaml: nested deeper than 32 levels", id="deep"),
    pytest.param("a: " + "[" * 40 + "]" * 40 + "\n", "t.yaml:1: nested deeper than 32 levels", id="deep-not-recursion"),
    pytest.param("name: [" + "x, " * 400_000 + "]\n", "t.yaml: over 1 MiB", id="too-big"),
    pytest.param(_bad("name: t", 'name: "a\x00b"'), "t.yaml: invalid YAML: unacceptable character #x0000", id="nul"),
])
def test_hostile_yaml_is_refused_fast_in_one_line(text, expected):
    import time

    t0 = time.monotonic()
    with pytest.raises(SpecError) as e:
        parse_spec(text, source="t.yaml")
    assert time.monotonic() - t0 < 5
    assert str(e.value).startswith(expected) and "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)


def test_anchors_and_aliases_within_the_limits_work():
    text = _bad("batch: [2]\n", "batch: *b\n").replace("    seqlen: [1024]", "    seqlen: [1024]\n    batch: &b [3]")
    spec = parse_spec(text, source="t.yaml")
    assert [m.batch for m in spec.models] == [[3], [3], [3]]


def test_binary_file_is_one_line(tmp_path):
    p = tmp_path / "bin.yaml"
    p.write_bytes(b"name: x\n\xff\xfe\x00\x01")
    with pytest.raises(SpecError, match=r"bin.yaml:2: not UTF-8 text \(byte 8"):
        load_spec(p)


def test_a_stem_that_is_not_a_safe_name_needs_a_name(tmp_path):
    p = tmp_path / "my spec.yaml"
    p.write_text(GOOD.replace("name: t\n", ""))
    with pytest.raises(SpecError, match=r"the file's stem 'my spec' is not a safe file name .*; add a 'name'"):
        load_spec(p)
    assert load_spec(_write(tmp_path / "my-spec.yaml", GOOD.replace("name: t\n", ""))).name == "my-spec"


def test_path_under_a_regular_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(SpecError, match=r"f/x.yaml: cannot read: Not a directory"):
        load_spec(tmp_path / "f" / "x.yaml")


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


SHIPPED_BASE = GOOD.replace("    tp: [1, 2]\n", "    tp: [1, 2, 4]\n").replace(
    "dtypes: [bf16]\n", "packed_sequences: [false, true]\ndtypes: [bf16]\nnorm_weight_dtypes: [fp32, bf16]\n")


def test_the_shipped_section_narrows_the_sweep_to_the_part_the_bundle_holds():
    text = SHIPPED_BASE + ("shipped:\n  tp: [2, 1]\n  seqlen: [8192]\n  packed_sequences: [false]\n"
                           "  norm_weight_dtypes: [fp32]\n  kernels: [gated_norm_fwd]\n")
    whole, part = parse_spec(text, source="t.yaml"), parse_spec(text, source="t.yaml", shipped=True)
    assert [(m.name, m.tp) for m in whole.models] == [("nemotron-3-nano-30b", 1), ("nemotron-3-nano-30b", 2),
                                                      ("nemotron-3-nano-30b", 4), ("custom", 1)]
    # The custom model's own seqlen (1024) is not kept: it leaves the shipped part.
    assert [(m.name, m.tp, m.seqlen) for m in part.models] == [("nemotron-3-nano-30b", 1, [8192]),
                                                              ("nemotron-3-nano-30b", 2, [8192])]
    assert (part.packed_sequences, part.norm_weight_dtypes, part.kernels) == ([False], ["fp32"], ["gated_norm_fwd"])
    assert (part.name, part.sha256, part.budget, part.tolerances) == (whole.name, whole.sha256, whole.budget,
                                                                      whole.tolerances)
    # The same plan as a spec written out with those lists.
    custom = "  - name: custom\n    dims: {d_inner: 1024, headdim: 64, ngroups: 2, dstate: 64, chunk_size: 64}\n" \
             "    seqlen: [1024]\n"
    written = SHIPPED_BASE.replace(custom, "").replace("tp: [1, 2, 4]", "tp: [1, 2]").replace(
        "seqlen: [8192, 4096]", "seqlen: [8192]").replace(
        "packed_sequences: [false, true]", "packed_sequences: [false]").replace(
        "norm_weight_dtypes: [fp32, bf16]", "norm_weight_dtypes: [fp32]").replace(
        "kernels: [gated_norm_fwd, gated_norm_bwd]", "kernels: [gated_norm_fwd]")
    assert custom in SHIPPED_BASE and "custom" not in written
    expected = {c.key for c in plan(parse_spec(written, source="w.yaml"))}
    assert {c.key for c in plan(part)} == expected
    assert {c.key for c in plan(whole)} > expected
    # Without the flag a spec is the whole sweep; asking for a part it does not name is an error.
    with pytest.raises(SpecError, match=re.escape("t.yaml: no 'shipped' section")):
        parse_spec(SHIPPED_BASE, source="t.yaml", shipped=True)


@pytest.mark.parametrize("section, expected", [
    ("  tp: [8]\n", "t.yaml:24: shipped.tp[0]: 8 is not in the sweep's tp (1, 2, 4)"),
    ("  tp: [1, 1]\n", "t.yaml:24: shipped.tp[1]: 1 listed twice"),
    ("  seqlen: [2048]\n", "t.yaml:24: shipped.seqlen[0]: 2048 is not in the sweep's seqlen (8192, 4096, 1024)"),
    ("  packed_sequences: [true]\n  dtypes: [fp16]\n",
     "t.yaml:25: shipped.dtypes[0]: fp16 is not in the sweep's dtypes (bf16)"),
    ("  kernels: [ssd_bmm]\n", "t.yaml:24: shipped.kernels[0]: ssd_bmm is not in the sweep's kernels "
                                "(gated_norm_fwd, gated_norm_bwd)"),
    ("  norm_weight_dtypes: [bf16, fp64]\n", "t.yaml:24: shipped.norm_weight_dtypes[1]: Input should be"),
    ("  kernels: []\n", "t.yaml:24: shipped.kernels: List should have at least 1 item"),
    ("  colour: [red]\n", "t.yaml:24: shipped.colour: unknown key"),
    ("  tp: [4]\n  seqlen: [1024]\n", "t.yaml:23: shipped: leaves no model shape"),
])
def test_a_bad_shipped_section_is_one_line_even_without_the_flag(section: str, expected: str) -> None:
    text = SHIPPED_BASE + "shipped:\n" + section
    for shipped in (False, True):
        with pytest.raises(SpecError, match="^" + re.escape(expected)):
            parse_spec(text, source="t.yaml", shipped=shipped)


PER_SKU = SHIPPED_BASE + ("shipped:\n  h200:\n    tp: [1, 2]\n    seqlen: [8192]\n"
                          "  h100: {tp: [1], packed_sequences: [false], kernels: [gated_norm_bwd]}\n")


def test_the_shipped_section_names_a_part_per_sku():
    whole = parse_spec(PER_SKU, source="t.yaml")
    assert whole.shipped_skus == ["h200", "h100"] and whole.target.gpu == "h200"
    h200 = parse_spec(PER_SKU, source="t.yaml", shipped=True)
    h100 = parse_spec(PER_SKU, source="t.yaml", shipped=True, gpu="h100")
    assert parse_spec(PER_SKU, source="t.yaml", shipped=True, gpu="h200") == h200
    assert [(m.tp, m.seqlen) for m in h200.models] == [(1, [8192]), (2, [8192])]
    assert (h200.kernels, h200.packed_sequences) == (["gated_norm_fwd", "gated_norm_bwd"], [False, True])
    # The h100 part is read for the h100: the same sweep, retargeted, narrowed by its own lists.
    assert (h100.target.gpu, h100.target.arch) == ("h100", "sm90")
    assert [(m.name, m.tp, m.seqlen) for m in h100.models] == [("nemotron-3-nano-30b", 1, [8192, 4096]), ("custom", 1, [1024])]
    assert (h100.kernels, h100.packed_sequences) == (["gated_norm_bwd"], [False])
    assert {c.kernel for c in plan(h100)} == {"gated_norm_bwd"}
    # --gpu without --shipped: the whole sweep for that SKU.
    assert parse_spec(PER_SKU, source="t.yaml", gpu="h100") == whole.model_copy(
        update={"target": whole.target.model_copy(update={"gpu": "h100"})})
    # The flat form is the target's part: the same as naming it under the target.
    flat = SHIPPED_BASE + "shipped:\n  tp: [1, 2]\n  seqlen: [8192]\n"
    assert parse_spec(flat, source="t.yaml").shipped_skus == ["h200"]
    assert plan(parse_spec(flat, source="t.yaml", shipped=True)) == plan(h200)
    # A SKU the section does not name: an error naming the file and the SKU.
    for text, has in ((flat, "for h200 only"), (PER_SKU.replace("  h100: {", "  gh200: {"), "for h200, gh200 only")):
        with pytest.raises(SpecError, match="^" + re.escape(f"t.yaml: no 'shipped' section for h100 (it has a part {has})")):
            parse_spec(text, source="t.yaml", shipped=True, gpu="h100")


@pytest.mark.parametrize("section, expected", [
    ("  h300: {tp: [1]}\n", "t.yaml:24: shipped.h300: unknown key 'h300'; did you mean 'h200'?"),
    ("  b200: {tp: [1]}\n", "t.yaml:24: shipped.b200: b200 is sm100, but the spec targets h200 (sm90); a section is "
                            "for a SKU of sm90 (h100, h200, gh200)"),
    ("  tp: [1]\n  h100: {tp: [1]}\n", "t.yaml:25: shipped.h100: mixes per-SKU sections (h100) with the flat form "
                                       "(tp); put every list under its SKU, e.g. h200: {tp: ...}"),
    ("  h100: {tp: [8]}\n", "t.yaml:24: shipped.h100.tp[0]: 8 is not in the sweep's tp (1, 2, 4)"),
    ("  h100:\n    kernels: [gated_norm_fwd, ssd_bmm]\n",
     "t.yaml:25: shipped.h100.kernels[1]: ssd_bmm is not in the sweep's kernels"),
    ("  h100: {colour: [red]}\n", "t.yaml:24: shipped.h100.colour: unknown key 'colour'; known keys here: tp, batch"),
    ("  h100: [1]\n", "t.yaml:24: shipped.h100: the part shipped for h100 is a mapping of lists (tp, batch"),
    ("  h200: {tp: [1]}\n  h100:\n    tp: [4]\n    seqlen: [1024]\n", "t.yaml:25: shipped.h100: leaves no model shape"),
])
def test_a_bad_per_sku_shipped_section_is_one_line(section: str, expected: str) -> None:
    text = SHIPPED_BASE + "shipped:\n" + section
    for gpu in ("h200", "h100"):
        with pytest.raises(SpecError, match="^" + re.escape(expected)) as e:
            parse_spec(text, source="t.yaml", shipped=True, gpu=gpu)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("gpu, expected", [
    ("h300", "t.yaml: --gpu 'h300': unknown GPU SKU; known: a100, "),
    ("b200", "t.yaml: --gpu b200 is sm100, but the spec targets h200 (sm90); give a SKU of sm90: h100, h200, gh200"),
])
def test_reading_a_spec_for_an_unknown_sku_or_one_of_another_arch_is_one_line(gpu: str, expected: str) -> None:
    for shipped in (False, True):
        with pytest.raises(SpecError, match="^" + re.escape(expected)):
            parse_spec(PER_SKU, source="t.yaml", shipped=shipped, gpu=gpu)


def test_sweep_shipped_tunes_the_part_of_the_gpu_it_runs_on_when_the_spec_names_it():
    from autotune_cli.shipped import sweep_section

    named = ["h200", "h100"]
    assert sweep_section("h200", named, "h200", allow_gpu_mismatch=False) == "h200"
    # On an H100, the h100 part, but only where --allow-gpu-mismatch lets the sweep run there at all.
    assert sweep_section("h200", named, "h100", allow_gpu_mismatch=True) == "h100"
    assert sweep_section("h200", named, "h100", allow_gpu_mismatch=False) == "h200"
    # A GPU the spec names no part for, or none known (a Slurm array, a dry run): the target's part.
    assert sweep_section("h200", named, "gh200", allow_gpu_mismatch=True) == "h200"
    assert sweep_section("h200", named, None, allow_gpu_mismatch=True) == "h200"
