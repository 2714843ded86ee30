"""`sweep --cpu-dry-run` at dims a CPU holds (autotune_cli.dry_run): a shipped spec's models are
shrunk, with every kernel, option and dtype of the real shapes kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autotune_cli.dry_run import CPU_ELEMENTS, cpu_elements, shrink_for_cpu, signature
from autotune_cli.plan import plan
from autotune_cli.spec import load_spec
from mamba_tune.bundle import load_bundle

ROOT = Path(__file__).resolve().parents[2]
SPEC_8B = ROOT / "sweeps/nemotron-h-8b.yaml"


def test_the_8b_spec_shrinks_to_cpu_size_keeping_kernels_options_dtypes_and_group_ratio():
    spec = load_spec(SPEC_8B)
    small, notes = shrink_for_cpu(spec)
    assert len(small.models) == len(spec.models) == len(notes)
    for real, m in zip(spec.models, small.models):
        assert cpu_elements(real) > CPU_ELEMENTS >= cpu_elements(m), (real, m)
        assert (m.name, m.tp, m.headdim, m.dstate, m.chunk_size) == (real.name, real.tp, real.headdim, real.dstate,
                                                                    real.chunk_size)
        assert m.nheads // m.ngroups == real.nheads // real.ngroups and m.nheads % m.ngroups == 0
        # Two chunks (8192 and 4096 are whole chunks), batch at most 2.
        assert m.seqlen == [2 * m.chunk_size] and max(m.batch) <= 2
        # Every (kernel, dtype, options) the real shapes run, the shrunk ones run too.
        assert signature(plan(spec.model_copy(update={"models": [real]}))) <= \
            signature(plan(small.model_copy(update={"models": [m]})))
    assert {c.kernel for c in plan(spec)} == {c.kernel for c in plan(small)}
    assert notes[0].startswith("nemotron-h-8b tp=1: seqlen 8192,4096 -> 256, batch 2, nheads 128 -> 32, "
                               "ngroups 8 -> 2 (16 heads per group kept)"), notes[0]


def test_a_spec_a_cpu_holds_is_left_as_it_is():
    spec = load_spec(ROOT / "tests/data/tiny.yaml")
    assert shrink_for_cpu(spec) == (spec, [])


@pytest.mark.slow
def test_cpu_dry_run_of_the_8b_spec_runs_at_shrunk_dims_and_says_so(tmp_path):
    """End to end through real workers, one kernel at one TP degree (the whole spec is 64 combos)."""
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autotune_cli", "sweep", str(SPEC_8B), "--cpu-dry-run", "-o", str(out),
                        "--log-dir", str(tmp_path / "logs"), "--kernel", "gated_norm_fwd", "--origin", "tp=8 "],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "cpu dry run: dims shrunk so a CPU holds them (the same kernels, options and dtypes):" in r.stderr
    assert "nemotron-h-8b tp=8: seqlen 8192,4096 -> 256, batch 2, nheads 16, ngroups 1" in r.stderr
    entries = load_bundle(out / "cpu" / "nemotron-h-8b.json").entries.values()
    # TP 8: 16 heads x 64 = d 1024 in one group; batch 2 x seqlen 256 rows; fp32 and bf16 norm weights.
    assert sorted((e.dims["rows"], e.dims["d"], e.dims["weight_fp32"]) for e in entries) == [(512, 1024, 0),
                                                                                           (512, 1024, 1)]
