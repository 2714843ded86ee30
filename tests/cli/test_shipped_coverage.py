"""The coverage gate on the repository as shipped: for each SKU with a committed bundle
(generated_configs/<sku>/), the part of each spec in sweeps/ that its `shipped` section names for
that SKU is covered by that SKU's bundles (`mamba-tune check --shipped --gpu SKU`, the command CI
runs), each entry fresh (kernel source hash, versions) and its config accepted by its kernel's
config space. Entries of another SKU never count (check reads DIR/<sku>/ only).

The rest of each spec (every kernel, the backward's too, more seqlens and TP degrees) extends the
same bundle when run on the GPU; it is not expected to be covered yet, and `check` without
--shipped says what is missing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "sweeps").glob("*.yaml"))


# (spec, SKU) for every SKU the spec's `shipped` section names a part for. One process checks
# them all where it can: the config spaces Helion builds (most of the time) are cached per kernel
# shape, and the specs share shapes (Mamba2 and Zamba2's norm, a TP2 shape and a smaller model's).
# The xdist group keeps them on one pytest-xdist worker: an H100 part and the H200 part of one spec
# (Nano's: 30 and 22 combos) bind mostly the same shapes.
CASES = [pytest.param(p, sku, id=f"{p.stem}-{sku}", marks=pytest.mark.xdist_group("shipped-coverage"))
         for p in SPECS for sku in load_spec(p).shipped_skus]


def test_every_spec_ships_a_part_with_its_bundle_and_each_model_spec_one_per_committed_sku():
    skus = sorted(d.name for d in (ROOT / "generated_configs").iterdir() if d.is_dir())
    assert skus == ["h100", "h200"]
    model_specs = 0
    for spec in SPECS:
        assert "\nshipped:\n" in spec.read_text(encoding="utf-8"), spec.name
        s = load_spec(spec)
        # A bundle of the spec's in each SKU folder it ships a part for.
        assert s.shipped_skus, spec.name
        for sku in s.shipped_skus:
            assert (ROOT / "generated_configs" / sku / f"{spec.stem}.json").is_file(), (spec.name, sku)
        # A model's whole sweep (one model) ships a part for every SKU folder; a spec of a few
        # models' other shapes (short sequences) may ship for the SKUs that tuned it.
        if len({m.name for m in s.models}) == 1:
            model_specs += 1
            assert sorted(s.shipped_skus) == skus, spec.name
    assert model_specs >= 6


@pytest.mark.slow
@pytest.mark.parametrize("spec, sku", CASES)
def test_shipped_part_is_covered_by_the_shipped_bundles(spec: Path, sku: str) -> None:
    r = CliRunner().invoke(app, ["check", str(spec), "--shipped", "--gpu", sku,
                                 "--bundles", str(ROOT / "generated_configs")])
    assert r.exit_code == 0, r.output


def test_the_whole_sweep_is_checked_without_the_flag(tmp_path: Path) -> None:
    # Against no bundle at all: every combo is missing, the whole sweep's count without --shipped.
    (tmp_path / "h200").mkdir()
    spec = str(ROOT / "sweeps" / "nemotron-h-8b.yaml")
    counts = {}
    for flag in ([], ["--shipped"]):
        r = CliRunner().invoke(app, ["check", spec, *flag, "--bundles", str(tmp_path), "--format", "json"])
        assert r.exit_code == 1, r.output
        counts[bool(flag)] = json.loads(r.output)["counts"]["missing"]
    assert 0 < counts[True] < counts[False]
