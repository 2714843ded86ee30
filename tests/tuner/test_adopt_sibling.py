"""`sweep --adopt-sibling`: a combo whose key a sibling SKU's bundle holds, fresh, takes that
entry's config after a check and a timing, with no search; anything else is searched."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from bundles import H100, H200, bundle, entry
from rich.console import Console
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.plan import Combo, plan
from autotune_cli.spec import DEFAULT_TOLERANCES, Budget, load_spec
from autotune_cli.sweep_job import SweepInputError, SweepJob, SweepOptions, adoption
from autotune_cli.tuner import adopt_problem, not_adopted
from mamba_tune.bundle import Accuracy, GpuInfo, load_bundle, write_bundle

ROOT = Path(__file__).resolve().parents[2]
B200 = GpuInfo(name="NVIDIA B200", sku="b200", arch="sm100", compute_capability="10.0", sm_count=148)
CPU = GpuInfo(name="CPU", sku="cpu", arch="cpu", compute_capability="0.0", sm_count=0)
FWD_CFG = {"block_sizes": [8, 1], "num_warps": 4, "num_stages": 1}
BWD_CFG = {"block_sizes": [8, 1, 1], "num_warps": 4, "num_stages": 1}
STALE = "0" * 64  # a kernel source hash no checkout has


def job(tmp_path: Path, *paths: Path, combos: list[Combo] = (), dry: bool = False,  # type: ignore[assignment]
        adopt: bool = True) -> SweepJob:
    return SweepJob(list(combos), budget=Budget(effort="none"), tolerances=DEFAULT_TOLERANCES, target_sku="h100",
                    bundle_name="t", spec_ref=None,
                    options=SweepOptions(out_dir=tmp_path, warm_start=paths, adopt_sibling=adopt, cpu_dry_run=dry))


def tiny_tp1(tmp_path: Path) -> tuple[Path, dict[tuple[str, int], Combo]]:
    """The tiny spec at TP 1 (4 combos: the norm forward and backward at 64 and 40 rows)."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text((ROOT / "tests/data/tiny.yaml").read_text().replace("tp: [1, 2]", "tp: [1]"))
    return spec, {(c.kernel, c.dims["rows"]): c for c in plan(load_spec(spec))}


def test_only_a_sibling_bundle_is_adopted_from_and_bad_input_is_one_line(tmp_path):
    paths = {name: tmp_path / f"{name}.json" for name in ("h100", "h200", "b200", "cpu")}
    for name, gpu in (("h100", H100), ("h200", H200), ("b200", B200), ("cpu", CPU)):
        write_bundle(bundle(entry(), gpu=gpu), paths[name])
    assert [b.provenance.gpu.sku for b in job(tmp_path, paths["h200"]).warm_bundles("h100")] == ["h200"]
    with pytest.raises(SweepInputError, match=r"^--adopt-sibling needs --warm-start BUNDLE"):
        job(tmp_path).warm_bundles("h100")
    with pytest.raises(SweepInputError, match=r"^--adopt-sibling: --warm-start .*h100\.json: tuned on h100, this "
                                              r"GPU's own SKU: --adopt-sibling adopts a sibling SKU's entries \(gh200 or h200\)"):
        job(tmp_path, paths["h200"], paths["h100"]).warm_bundles("h100")
    with pytest.raises(SweepInputError, match=r"--warm-start .*b200\.json: tuned on b200 \(sm100\), not a sibling of "
                                              r"h100 \(sm90: gh200 or h200\)"):
        job(tmp_path, paths["b200"]).warm_bundles("h100")
    # A CPU dry run stands in for a new SKU: any GPU SKU's bundle, never a dry run's own.
    assert [b.provenance.gpu.sku for b in job(tmp_path, paths["b200"], dry=True).warm_bundles("cpu")] == ["b200"]
    with pytest.raises(SweepInputError, match=r"cpu\.json: tuned on cpu \(a dry run's own\)"):
        job(tmp_path, paths["cpu"], dry=True).warm_bundles("cpu")
    # Without the flag a dry run still takes only its own SKU's bundles.
    with pytest.raises(SweepInputError, match=r"tuned on h200, this sweep tunes on cpu"):
        job(tmp_path, paths["h200"], dry=True, adopt=False).warm_bundles("cpu")


def test_cli_refuses_bad_adopt_input_before_writing_anything(tmp_path):
    runner = CliRunner()
    out = tmp_path / "out"
    cpu = tmp_path / "cpu.json"
    write_bundle(bundle(entry(), gpu=CPU), cpu)
    base = ["sweep", str(ROOT / "tests/data/tiny.yaml"), "-o", str(out), "--cpu-dry-run", "--log-dir",
            str(tmp_path / "logs"), "--adopt-sibling"]
    for extra, said in (([], "--adopt-sibling needs --warm-start BUNDLE"),
                        (["--warm-start", str(cpu)], "tuned on cpu (a dry run's own)")):
        r = runner.invoke(app, [*base, *extra])
        assert r.exit_code == 2, r.output
        line = r.stderr.strip().splitlines()[-1]  # after the dry run's notes
        assert line.startswith("error: ") and said in line, r.stderr
        assert not out.exists()  # no folder, no lock, no bundle


def test_the_job_adopts_the_first_fresh_sibling_entry_and_refuses_a_stale_one(tmp_path):
    spec, combos = tiny_tp1(tmp_path)
    fwd, bwd = combos["gated_norm_fwd", 64], combos["gated_norm_bwd", 64]
    stale = bundle(entry("gated_norm_fwd", dims=fwd.dims, config={**FWD_CFG, "num_warps": 8}), gpu=H200,
                   kernel_hashes={"gated_norm_fwd": STALE})
    fresh = bundle(entry("gated_norm_fwd", dims=fwd.dims, config=FWD_CFG), gpu=H100)
    assert adoption(fwd, [stale, fresh]) == {"from": "h100", "config": FWD_CFG, "config_spec_fingerprint": None}
    assert adoption(fwd, [stale]) == {"from": "h200", "refused": "kernel gated_norm_fwd changed since h200 tuned it"}
    assert adoption(bwd, [stale, fresh]) is None
    # The flag travels in the worker's job description (both executors write it with worker_job).
    assert job(tmp_path).worker_job(fwd, [fresh], [fresh])["adopt"]["config"] == FWD_CFG
    assert "adopt" not in job(tmp_path, adopt=False).worker_job(fwd, [fresh], [fresh])
    assert job(tmp_path).adoption_note([fwd, bwd], [stale, fresh]) == \
        " (1 to adopt from h100 after a check, the rest searched)"
    assert job(tmp_path, adopt=False).adoption_note([fwd, bwd], [stale, fresh]) == ""


def test_what_refuses_an_adoption():
    ok = Accuracy(passed=True, atol=0.01, factor=2.0, max_abs_err={"out": 0.01}, lowp_abs_err={"out": 0.02},
                  bound={"out": 0.05})
    bad = ok.model_copy(update={"passed": False, "max_abs_err": {"out": 0.5}})
    assert not_adopted(ok) is None and not_adopted(ok, 0.10, 0.10) is None and not_adopted(ok, 0.09, 0.10) is None
    assert not_adopted(bad, 0.09, 0.10).startswith("numerics check failed against the fp32 reference (out: err 0.5")
    assert not_adopted(ok, 0.11, 0.10) == "it runs in 0.1100 ms here, slower than the default config's 0.1000 ms"
    adopt = {"from": "h200", "config": FWD_CFG, "config_spec_fingerprint": "a" * 64}
    assert adopt_problem(adopt, None, "a" * 64) is None
    assert adopt_problem({**adopt, "config_spec_fingerprint": None}, None, "b" * 64) is None  # none recorded
    assert adopt_problem(adopt, None, "b" * 64) == "tuned in another config space (fingerprint aaaaaaaaaaaa != " \
                                                   "bbbbbbbbbbbb here)"
    assert adopt_problem(adopt, "InvalidConfig: x", "a" * 64) == "its config does not fit this kernel here: " \
                                                                 "InvalidConfig: x"
    assert adopt_problem({"from": "h200", "refused": "kernel k changed"}, None, "a" * 64) == "kernel k changed"


@pytest.mark.slow
def test_a_dry_run_sweep_adopts_fresh_fitting_entries_and_searches_the_rest(tmp_path):
    """One real sweep (worker processes, ref mode) of 4 combos: the norm forward at 64 rows is
    adopted; at 40 rows no sibling has it; the backward's 64-row entry has a config the kernel
    rejects, its 40-row entry a stale kernel source: those three are searched as before."""
    spec, combos = tiny_tp1(tmp_path)
    h200 = bundle(entry("gated_norm_fwd", dims=combos["gated_norm_fwd", 64].dims, config=FWD_CFG),
                  entry("gated_norm_bwd", dims=combos["gated_norm_bwd", 64].dims, config=FWD_CFG), gpu=H200)
    h100 = bundle(entry("gated_norm_bwd", dims=combos["gated_norm_bwd", 40].dims, config=BWD_CFG), gpu=H100,
                  kernel_hashes={"gated_norm_bwd": STALE})
    write_bundle(h200, tmp_path / "h200.json")
    write_bundle(h100, tmp_path / "h100.json")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autotune_cli", "sweep", str(spec), "-o", str(out), "--cpu-dry-run",
                        "--log-dir", str(out / "logs"), "--adopt-sibling", "--warm-start", str(tmp_path / "h200.json"),
                        "--warm-start", str(tmp_path / "h100.json")],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    entries = load_bundle(out / "cpu" / "tiny.json").entries
    assert len(entries) == 4
    got = {(e.kernel, e.dims["rows"]): e for e in entries.values()}
    adopted = got["gated_norm_fwd", 64]
    assert adopted.config == FWD_CFG and adopted.search.adopted_from == "h200"
    assert (adopted.search.algorithm, adopted.search.configs_tried, adopted.search.budget_seconds) == ("none", 1, None)
    for k in (("gated_norm_fwd", 40), ("gated_norm_bwd", 64), ("gated_norm_bwd", 40)):
        assert got[k].search.adopted_from is None, k
    assert got["gated_norm_bwd", 64].config != FWD_CFG and got["gated_norm_bwd", 40].config != BWD_CFG
    flat = " ".join(r.stderr.split())
    assert flat.count("adopted from h200 (no search)") == 1, r.stderr[-3000:]
    # The opening line counts what the sibling bundles offer: the rejected config is offered (the
    # worker refuses it), the stale entry is not.
    assert "4 to tune on CPU dry run (Helion ref mode, default configs, no search) (2 to adopt from h200 after a " \
           "check, the rest searched)" in " ".join((r.stdout + r.stderr).split()), r.stdout[-2000:]
    logs = "".join(p.read_text() for p in (out / "logs").rglob("*.log"))
    assert "not adopting the h200 entry's config (its config does not fit this kernel here: InvalidConfig: Not " \
           "enough values for config['block_sizes']" in logs, logs[-3000:]
    assert "not adopting the h100 entry's config (kernel gated_norm_bwd changed since h100 tuned it); searching " \
           "as without --adopt-sibling" in logs
    assert logs.count("not adopting") == 2
    # `show` marks it.
    shown = CliRunner().invoke(app, ["show", str(out / "cpu" / "tiny.json")], env={"COLUMNS": "400"})
    assert shown.stdout.count("adopted from h200 (no search)") == 1


@pytest.mark.slow
def test_the_slurm_task_adopts_from_the_job_description(tmp_path):
    """The Slurm executor writes the adoption into the combo's job.json (`SweepJob.worker_job`);
    its task runs the real worker on it and merges the adopted entry into the bundle."""
    from autotune_cli.slurm import SlurmOptions, SlurmSweep
    from autotune_cli.slurm_task import run_task

    _, combos = tiny_tp1(tmp_path)
    fwd = combos["gated_norm_fwd", 40]
    sibling = bundle(entry("gated_norm_fwd", dims=fwd.dims, config=FWD_CFG), gpu=H200)
    j = job(tmp_path, combos=[fwd], dry=True)
    d = SlurmSweep(j, SlurmOptions(), Console(file=io.StringIO()))._prepare(fwd, None, [sibling])
    assert '"adopt": {' in (d / "job.json").read_text()
    (tmp_path / "cpu").mkdir(exist_ok=True)
    run_task(str(d))
    (e,) = load_bundle(tmp_path / "cpu" / "t.json").entries.values()
    assert (e.config, e.search.adopted_from) == (FWD_CFG, "h200")
