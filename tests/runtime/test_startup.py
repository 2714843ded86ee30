"""Start-up: the commands that only read specs and bundles import neither torch nor helion.

Importing torch and helion takes seconds; `mamba-tune --help`, `plan`, `validate` of specs,
`show`, `diff`, `check` (until a bundle entry's config is checked), `report`, `results` and the
Slurm executor's `status` and `collect` need neither.
Validating a bundle checks its configs against their kernels' config spaces with Helion, so
it imports both (only then). Checked on the modules a fresh interpreter has loaded, not on
timings, so that a busy machine cannot make it flaky.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "helion", "triton")

# In a fresh interpreter: import the app, print the heavy modules loaded, then run each
# command given as a JSON list of argument lists in-process and print them again.
PROBE = """
import json, sys
HEAVY = {heavy!r}
def loaded():
    return sorted(m for m in HEAVY if m in sys.modules)
import autotune_cli.app
from typer.testing import CliRunner
report = {{"import": loaded()}}
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(autotune_cli.app.app, args)
    report[" ".join(args)] = [r.exit_code, loaded(), r.output[-500:]]
print(json.dumps(report))
"""


def probe(commands: list[list[str]], clean_env: dict[str, str]) -> dict[str, list]:
    code = PROBE.format(heavy=HEAVY)
    r = subprocess.run([sys.executable, "-c", code, json.dumps(commands)], cwd=ROOT, env=clean_env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_light_commands_import_no_torch_or_helion(clean_env: dict[str, str], tmp_path: Path) -> None:
    spec = "sweeps/nemotron-nano.yaml"
    bundles = "generated_configs/h200"
    commands = [
        ["--help"],
        ["plan", spec],
        ["plan", spec, "--json"],
        ["validate", "sweeps"],
        ["show", f"{bundles}/nemotron-nano.json"],
        ["diff", bundles, bundles],
        # No bundle (an empty folder): every combo missing, exit 1. With bundles, check imports helion to
        # check their configs, as `validate` of a bundle does.
        ["check", spec, "--bundles", str(tmp_path / "no-bundles")],
        ["report", f"{bundles}/nemotron-nano.json", "-o", str(tmp_path / "report")],
        ["results", "benchmarks/results", "-o", str(tmp_path / "results.md")],
        ["sweep", "--help"],
        ["bench", "--help"],
        # The Slurm executor's bookkeeping (its modules, and an array task's, load on the first
        # call): no sweep state in an empty folder, exit 2.
        ["status", str(tmp_path / "no-bundles")],
        ["collect", str(tmp_path / "no-bundles")],
    ]
    (tmp_path / "no-bundles").mkdir()
    report = probe(commands, clean_env)
    assert report.pop("import") == []
    for command, (code, heavy, output) in report.items():
        # (check exits 1 where the shipped bundles do not cover the spec: issue 19 item 5.)
        expected = (0, 1) if command.startswith("check") else (2,) if command.split()[0] in ("status", "collect") \
            else (0,)
        assert code in expected, f"mamba-tune {command}: {output}"
        assert heavy == [], f"mamba-tune {command} imported {', '.join(heavy)}"
    assert (tmp_path / "report").is_dir()


def test_the_probe_sees_a_command_that_imports_torch(clean_env: dict[str, str], tmp_path: Path) -> None:
    # A sweep needs torch (to find the GPU): the probe must see that, or the test above would
    # pass for the wrong reason. (No GPU here: it stops with exit 2, before its workers' jobs
    # load the kernels with helion; test_validating_a_bundle_imports_helion sees helion.)
    report = probe([["sweep", "tests/data/tiny.yaml", "-o", str(tmp_path / "out"), "--log-dir",
                     str(tmp_path / "logs")]], clean_env)
    assert report.pop("import") == []
    (_code, heavy, output), = report.values()
    assert "torch" in heavy, output


def test_validating_a_bundle_imports_helion(clean_env: dict[str, str], tmp_path: Path) -> None:
    # A bundle's configs are checked against their kernels' config spaces (Helion's own
    # check), so validate loads helion for a bundle; one entry keeps the test short.
    shipped = json.loads((ROOT / "generated_configs/h200/nemotron-nano.json").read_text(encoding="utf-8"))
    key, entry = next(iter(shipped["entries"].items()))
    shipped["entries"] = {key: entry}
    shipped["failures"] = {}
    shipped["provenance"]["kernels"] = {entry["kernel"]: shipped["provenance"]["kernels"][entry["kernel"]]}
    bundle = tmp_path / "one.json"
    bundle.write_text(json.dumps(shipped), encoding="utf-8")
    report = probe([["validate", str(bundle)]], clean_env)
    assert report.pop("import") == []
    (code, heavy, output), = report.values()
    assert code == 0, output
    assert "1/1 configs valid" in output, output
    assert "helion" in heavy and "torch" in heavy, output


def test_importing_the_app_loads_no_pydantic_or_yaml(clean_env: dict[str, str]) -> None:
    # What `mamba-tune --help` pays for: typer and rich, not the spec and bundle parsers.
    code = "import autotune_cli.app, sys; print(sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "[]"


def test_kernels_loads_its_names_on_first_use(clean_env: dict[str, str]) -> None:
    # `import mamba_tune` costs nothing until a kernel is used; the public names and the
    # submodules an `import mamba_tune` user may reach stay available as attributes.
    code = ("import mamba_tune, sys; before = 'torch' in sys.modules; "
            "names = [getattr(mamba_tune, n) for n in mamba_tune.__all__]; mamba_tune.runtime.Mode; mamba_tune.ssd; "
            "print(before, 'helion' in sys.modules, callable(mamba_tune.mamba_chunk_scan_combined))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["False", "True", "True"]


def test_the_key_schema_loads_no_torch(clean_env: dict[str, str]) -> None:
    # `plan`, `validate` of a spec and `check` read every kernel's key, dims_for and source hash
    # from mamba_tune.keys: all of it without torch, helion or triton.
    code = ("import sys, mamba_tune.keys as k; s = k.ModelShape(2, 8192, 64, 64, 8, 128, 128); "
            "n = sum(key.dims_for(s) is not None and len(key.source_sha256()) == 64 for key in k.all_keys().values()); "
            f"print(n, sorted(m for m in {HEAVY!r} if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    count, heavy = r.stdout.split(maxsplit=1)
    assert int(count) > 10 and heavy.strip() == "[]", r.stdout


def test_a_fresh_sweeps_worker_jobs_load_no_kernels(clean_env: dict[str, str]) -> None:
    # The Slurm submitter writes every task's job file before any combo is tuned: with no bundle
    # entry of the kernel to start its search from, the job needs no tuning record (helion and the
    # kernels). (With one, tests/tuner/test_warm_start.py: the record's size dims pick the configs.)
    code = f"""
import sys
sys.path.insert(0, "tests")
from pathlib import Path
from bundles import bundle, entry, norm_dims
from autotune_cli.plan import plan
from autotune_cli.spec import load_spec
from autotune_cli.sweep_job import SweepJob, SweepOptions
spec = load_spec(Path("tests/data/tiny.yaml"))
combo = next(c for c in plan(spec) if c.kernel == "gated_norm_fwd")
job = SweepJob(plan(spec), budget=spec.budget, tolerances=spec.tolerances, target_sku="h200", bundle_name="tiny",
               spec_ref=None, options=SweepOptions(out_dir=Path(".")))
other = bundle(entry("gated_norm_bwd", norm_dims(rows=combo.dims["rows"], d=combo.dims["d"])))
fresh = [job.worker_job(combo, []), job.worker_job(combo, [other])]
print([j["warm_start"] for j in fresh], sorted(m for m in {HEAVY!r} if m in sys.modules))
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[[], []] []", r.stdout
