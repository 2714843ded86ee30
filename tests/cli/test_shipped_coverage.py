"""The coverage gate on the repository as shipped: the part of each spec in sweeps/ that its
`shipped` section names is covered by the committed bundles (`mamba-tune check --shipped`, the
command CI runs), each entry fresh (kernel source hash, versions) and its config accepted by its
kernel's config space.

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

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted((ROOT / "sweeps").glob("*.yaml"))


def test_every_preset_has_one_spec_with_a_shipped_part():
    assert len(SPECS) >= 6
    for spec in SPECS:
        assert "\nshipped:\n" in spec.read_text(encoding="utf-8"), spec.name
        assert (ROOT / "generated_configs" / "h200" / f"{spec.stem}.json").is_file(), spec.name


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_shipped_part_is_covered_by_the_shipped_bundles(spec):
    r = CliRunner().invoke(app, ["check", str(spec), "--shipped", "--bundles", str(ROOT / "generated_configs")])
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
