"""A sweep warns when its --timeout would likely kill combos before they finish (searches run past
their budget to end a generation: on the H200 a 30 s search ran 61-67 s and `--timeout 90` killed
its combos)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autotune_cli.plan import short_timeout_warning
from autotune_cli.spec import Budget

ROOT = Path(__file__).resolve().parents[2]
QUICK_30 = Budget(effort="quick", seconds_per_combo=30)


@pytest.mark.parametrize("timeout_s,warns", [(90, True), (129, True), (130, False), (600, False), (None, False)])
def test_a_timeout_under_twice_the_combo_estimate_warns(timeout_s, warns):
    warning = short_timeout_warning(timeout_s, QUICK_30)
    assert (warning is not None) is warns
    if warns:
        assert warning.startswith(f"--timeout {timeout_s} s is under 130 s, twice a combo's estimate (65 s")


def test_no_search_no_warning():
    assert short_timeout_warning(1, Budget(effort="none")) is None
    # quick effort without a cap: the plan's 180 s per search
    assert "under 430 s" in short_timeout_warning(100, Budget(effort="quick"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the command would start a real sweep")
def test_the_sweep_prints_it_before_it_starts(tmp_path):
    cmd = [sys.executable, "-m", "autotune_cli", "sweep", str(ROOT / "sweeps" / "nemotron-nano.yaml"), "--kernel", "gated_norm_fwd",
           "--timeout", "90", "--seconds-per-combo", "30", "-o", str(tmp_path / "out")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert "warning: --timeout 90 s is under 130 s" in r.stderr, r.stderr[-2000:]
    # Here (no GPU) the sweep then stops with its one-line error, and writes nothing.
    assert r.returncode == 2 and "error: no CUDA GPU on this machine" in r.stderr
    assert not (tmp_path / "out").exists()
    # A CPU dry run does not search (effort none): nothing to warn about.
    r = subprocess.run([*cmd, "--cpu-dry-run"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "warning: --timeout" not in r.stderr, r.stderr[-2000:]
