"""Warm start: each search starts from its key's config and the nearest tuned shapes'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bundles import bundle, entry, norm_dims
from rich.console import Console

from autotune_cli.plan import Combo
from autotune_cli.spec import DEFAULT_TOLERANCES, Budget
from autotune_cli.sweep import Sweep
from autotune_cli.sweep_job import SweepInputError, SweepJob, SweepOptions
from autotune_cli.tuning import get
from autotune_cli.warm_start import warm_configs
from mamba_tune.bundle import GpuInfo, write_bundle

SIZE_DIMS = get("gated_norm_fwd").size_dims
ROOT = Path(__file__).resolve().parents[2]


def cfg(n: int) -> dict[str, object]:
    return {"block_sizes": [n, 1], "num_warps": 4, "num_stages": 1}


def test_size_dims_are_what_the_nearest_rule_varies():
    assert "rows" in SIZE_DIMS and "has_z" not in SIZE_DIMS


def test_exact_key_first_then_nearest_shapes_in_log_distance():
    want = norm_dims(rows=8192)
    b = bundle(
        entry(dims=norm_dims(rows=65536), config=cfg(64)),  # distance log 8
        entry(dims=norm_dims(rows=16384), config=cfg(16)),  # log 2
        entry(dims=norm_dims(rows=4096), config=cfg(4)),  # log 2, smaller: wins the tie
        entry(dims=norm_dims(rows=8192), config=cfg(8)),  # the key itself
    )
    assert warm_configs(SIZE_DIMS, "gated_norm_fwd", want, "bf16", [b]) == [cfg(8), cfg(4), cfg(16)]
    assert warm_configs(SIZE_DIMS, "gated_norm_fwd", want, "bf16", [b], limit=5) == [cfg(8), cfg(4), cfg(16), cfg(64)]


def test_only_same_kernel_dtype_and_structure():
    want = norm_dims(rows=8192)
    b = bundle(
        entry(dims=norm_dims(rows=8192, has_z=0), config=cfg(1)),  # another structure
        entry(dims=norm_dims(rows=8192), dtype="fp16", config=cfg(2)),  # another dtype
        entry(kernel="gated_norm_bwd", dims=norm_dims(rows=8192),
              config={"block_sizes": [32, 1, 1], "num_warps": 4, "num_stages": 1}),  # another kernel
        entry(dims=norm_dims(rows=1 << 20), config=cfg(64)),  # far, but the only candidate: still a seed
    )
    assert warm_configs(SIZE_DIMS, "gated_norm_fwd", want, "bf16", [b]) == [cfg(64)]
    assert warm_configs(SIZE_DIMS, "gated_norm_fwd", want, "bf16", []) == []


def test_duplicates_count_once_and_the_first_bundle_wins_the_key():
    want = norm_dims(rows=8192)
    writing = bundle(entry(dims=want, config=cfg(8)), entry(dims=norm_dims(rows=16384), config=cfg(8)))
    other = bundle(entry(dims=want, config=cfg(512)), entry(dims=norm_dims(rows=4096), config=cfg(4)))
    assert warm_configs(SIZE_DIMS, "gated_norm_fwd", want, "bf16", [writing, other]) == [cfg(8), cfg(4)]


@pytest.mark.slow
def test_the_worker_job_carries_the_warm_start(tmp_path):
    """A real worker started by the sweep's scheduler: its job file holds the warm configs."""
    dims = norm_dims(rows=64, d=64, group_size=32)
    combo = Combo(kernel="gated_norm_fwd", dims=dims, dtype="bf16", origins=("test",))
    written = bundle(entry(dims=norm_dims(rows=128, d=64, group_size=32), config=cfg(2)))
    job = SweepJob([combo], budget=Budget(effort="none"), tolerances=DEFAULT_TOLERANCES, target_sku="h200",
                   bundle_name="t", spec_ref=None, options=SweepOptions(out_dir=tmp_path, cpu_dry_run=True))
    sweep = Sweep(job, console=Console(file=sys.stderr))
    running: list = []
    (tmp_path / "logs").mkdir()
    sweep._fill_slots([(1, combo, False)], [None], running, tmp_path, tmp_path / "logs", [written])
    try:
        (run,) = running
        job = json.loads((tmp_path / "combo-0001" / "job.json").read_text())
        assert job["warm_start"] == [cfg(2)]
    finally:
        for run in running:
            Sweep._kill(run)


def test_warm_start_bundles_must_be_readable_and_of_this_sku(tmp_path):
    h200 = tmp_path / "h200.json"
    write_bundle(bundle(entry()), h200)
    cpu = tmp_path / "cpu.json"
    write_bundle(bundle(entry(), gpu=GpuInfo(name="CPU", sku="cpu", arch="cpu", compute_capability="0.0",
                                              sm_count=0)), cpu)

    def sweep(*paths: Path) -> SweepJob:
        return SweepJob([], budget=Budget(effort="none"), tolerances=DEFAULT_TOLERANCES, target_sku="h200",
                        bundle_name="t", spec_ref=None, options=SweepOptions(out_dir=tmp_path, warm_start=paths))

    assert [b.provenance.gpu.sku for b in sweep(h200).warm_bundles("h200")] == ["h200"]
    # A sibling of the same arch (h200 for an h100 sweep) is a starting point; another arch is not.
    assert [b.provenance.gpu.sku for b in sweep(h200).warm_bundles("h100")] == ["h200"]
    with pytest.raises(SweepInputError, match=r"--warm-start .*cpu\.json: tuned on cpu, this sweep tunes on h200 "
                                              r"\(only h200 or gh200 or h100 configs"):
        sweep(h200, cpu).warm_bundles("h200")
    with pytest.raises(SweepInputError, match=r"--warm-start .*h200\.json: tuned on h200, this sweep tunes on b200"):
        sweep(h200).warm_bundles("b200")
    with pytest.raises(SweepInputError, match=r"--warm-start: .*missing\.json: cannot read"):
        sweep(tmp_path / "missing.json").warm_bundles("h200")


@pytest.mark.slow
def test_cli_refuses_a_bad_warm_start_before_writing_anything(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autotune_cli", "sweep", str(ROOT / "tests/data/tiny.yaml"), "-o",
                        str(out), "--cpu-dry-run", "--log-dir", str(tmp_path / "logs"), "--warm-start",
                        str(tmp_path / "nope.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "--warm-start: " in r.stderr and "nope.json: cannot read" in r.stderr
    assert not out.exists()  # nothing written: no folder, no lock, no bundle


def test_the_norm_starts_from_the_other_weight_dtypes_config_after_its_own_structures():
    # A bf16-weight norm search also starts from the fp32-weight entries (`seed_across`), at the
    # same distance but after same-structure shapes; other structural dims still never cross.
    tk = get("gated_norm_bwd")
    assert tk.seed_across == ("weight_fp32",)
    want = norm_dims(rows=8192, weight_fp32=0)
    b = bundle(
        entry(kernel=tk.name, dims=norm_dims(rows=8192, weight_fp32=1), config=cfg(1)),  # same size, fp32 weight
        entry(kernel=tk.name, dims=norm_dims(rows=4096, weight_fp32=0), config=cfg(2)),  # log 2, bf16 weight
        entry(kernel=tk.name, dims=norm_dims(rows=16384, weight_fp32=1), config=cfg(16)),  # log 2, fp32 weight
        entry(kernel=tk.name, dims=norm_dims(rows=8192, weight_fp32=1, has_z=0), config=cfg(4)),  # has_z differs
    )
    got = warm_configs(tk.size_dims, tk.name, want, "bf16", [b], across=tk.seed_across, limit=5)
    assert got == [cfg(1), cfg(2), cfg(16)]
    assert warm_configs(tk.size_dims, tk.name, want, "bf16", [b], limit=5) == [cfg(2)]  # without across


def test_seed_across_dims_leave_the_config_space_unchanged():
    # What makes a seed across weight_fp32 fit: both weight dtypes bind the norm kernels to the
    # same Helion config space (structural fingerprint), at Nano TP1's norm; bound in compiled
    # mode on the CPU, as `validate` checks bundle configs.
    from autotune_cli.lowering import config_spec
    from autotune_cli.tuning import all_kernels

    base = norm_dims(rows=16384, d=4096, group_size=512)
    same = {}
    for tk in all_kernels().values():
        for dim in tk.seed_across:
            fps = {v: config_spec(tk, {**base, dim: v}, "bf16").structural_fingerprint_hash() for v in (0, 1)}
            same[f"{tk.name}.{dim}"] = fps[0] == fps[1]
    assert same == {"gated_norm_fwd.weight_fp32": True, "gated_norm_bwd.weight_fp32": True}, same
