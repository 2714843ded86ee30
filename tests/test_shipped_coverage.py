"""The coverage gate on the repository as shipped: every spec in sweeps/ is covered by the
committed bundles (`mamba-tune check`, the command the example workflow runs), each entry fresh
(kernel source hash, versions) and its config accepted by its kernel's config space.

sweeps/planned/ holds the whole sweeps (every kernel, the backward's too, more seqlens), which
extend the same bundles when run on the H200; they are not expected to be covered yet.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune_cli.app import app

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted((ROOT / "sweeps").glob("*.yaml"))


def test_every_preset_has_a_checked_spec_and_a_planned_one():
    assert {p.stem for p in SHIPPED} == {p.stem for p in (ROOT / "sweeps/planned").glob("*.yaml")}
    assert len(SHIPPED) >= 6


@pytest.mark.slow
@pytest.mark.parametrize("spec", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_spec_is_covered_by_the_shipped_bundles(spec):
    r = CliRunner().invoke(app, ["check", str(spec), "--bundles", str(ROOT / "generated_configs")])
    assert r.exit_code == 0, r.output
