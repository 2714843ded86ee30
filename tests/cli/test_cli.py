"""The CLI: plan, validate, show, sweep/tune argument checks (CliRunner), exit codes 0/1/2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from bundles import H100, bundle, entry, norm_dims
from typer.testing import CliRunner

from autotune_cli.app import app
from mamba_tune.bundle import write_bundle

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args))


def test_plan_table_and_json():
    r = run("plan", str(ROOT / "sweeps/nemotron-nano.yaml"), "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    keys = [c["key"] for c in data["combos"]]
    assert len(keys) == len(set(keys))
    norm = [c for c in data["combos"] if c["kernel"].startswith("gated_norm")]
    # 2 kernels x (TP 1, 2, 4, 8) x (seqlen 8192, 4096) x (fp32, bf16 norm weight)
    assert len(norm) == 32
    assert {c["dims"]["d"] for c in norm} == {4096, 2048, 1024, 512}
    assert {c["dims"]["rows"] for c in norm} == {16384, 8192}
    assert {c["dims"]["weight_fp32"] for c in norm} == {0, 1}
    assert data["estimate_seconds_total"] == pytest.approx(data["estimate_seconds_per_combo"] * len(keys))
    r = run("plan", str(ROOT / "sweeps/nemotron-nano.yaml"), "--gpus", "2")
    assert r.exit_code == 0 and "estimate" in r.stdout


@pytest.mark.slow
def test_sweep_shipped_tunes_only_the_part_the_shipped_section_names(tmp_path):
    from mamba_tune.bundle import load_bundle

    spec = tmp_path / "tiny.yaml"
    spec.write_text((ROOT / "tests/data/tiny.yaml").read_text()
                    + "shipped: {tp: [1], seqlen: [64], kernels: [gated_norm_fwd]}\n")
    r = run("plan", str(spec), "--shipped", "--json")
    assert r.exit_code == 0, r.output
    (key,) = [c["key"] for c in json.loads(r.stdout)["combos"]]
    assert len(json.loads(run("plan", str(spec), "--json").stdout)["combos"]) > 1
    out = tmp_path / "out"
    r = run("sweep", str(spec), "--shipped", "--cpu-dry-run", "-o", str(out), "--log-dir", str(tmp_path / "logs"))
    assert r.exit_code == 0, r.output
    assert list(load_bundle(out / "cpu" / "tiny.json").entries) == [key]
    r = run("sweep", str(ROOT / "tests/data/tiny.yaml"), "--shipped", "--cpu-dry-run", "-o", str(out))
    assert r.exit_code == 2 and "no 'shipped' section" in r.output, r.output
    r = run("sweep", "--from-record", str(spec), "--shipped")
    assert r.exit_code == 2 and "--shipped goes with a SPEC" in r.output, r.output


def test_plan_deduplicates(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text((ROOT / "tests/data/tiny.yaml").read_text().replace("batch: [1]\nseqlen: [64, 40]",
                                                                        "batch: [1, 2]\nseqlen: [64, 32]"))
    r = run("plan", str(spec), "--json")
    data = json.loads(r.stdout)
    # rows = batch * seqlen: (1, 64) and (2, 32) give the same norm combo
    rows = sorted(c["dims"]["rows"] for c in data["combos"] if c["kernel"] == "gated_norm_fwd" and
                  c["dims"]["d"] == 64)
    assert rows == [32, 64, 128]
    merged = [c for c in data["combos"] if c["dims"].get("rows") == 64 and c["kernel"] == "gated_norm_fwd"
              and c["dims"]["d"] == 64]
    assert len(merged[0]["origins"]) == 2


def test_bad_spec_exits_2_with_one_line(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text((ROOT / "tests/data/tiny.yaml").read_text().replace("dtypes: [bf16]", "dtypes: [bf17]"))
    for cmd in ("plan", "sweep", "validate"):
        r = run(cmd, str(spec))
        assert r.exit_code == 2, (cmd, r.output)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln]
        assert len(lines) == 1 and "bad.yaml:10: dtypes[0]: Input should be" in lines[0], r.stderr


def test_sweep_without_gpu_points_at_plan(tmp_path):
    r = run("sweep", str(ROOT / "tests/data/tiny.yaml"), "-o", str(tmp_path / "out"))
    assert r.exit_code == 2
    assert "no CUDA GPU" in r.stderr and "mamba-tune plan" in r.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.json"))


def test_tune_argument_errors(tmp_path):
    r = run("tune", "gated_norm_fwd", "--dims", "rows=8,d=64", "-o", str(tmp_path))
    assert r.exit_code == 2 and "missing group_size" in r.stderr
    r = run("tune", "gated_norm_fwd", "--dims", "rows=8,width=3", "-o", str(tmp_path))
    assert r.exit_code == 2 and "has no dim 'width'" in r.stderr
    r = run("tune", "no_such_kernel", "--dims", "a=1")
    assert r.exit_code == 2 and "unknown kernel 'no_such_kernel'" in r.stderr
    r = run("tune", "gated_norm_fwd", "--dims", "rows=x")
    assert r.exit_code == 2 and "is not an integer" in r.stderr


def test_validate_and_show(tmp_path):
    good = tmp_path / "h200" / "good.json"
    write_bundle(bundle(entry(), entry("gated_norm_bwd", dims=norm_dims(rows=8192), baseline_ms=None)), good)
    r = run("validate", str(tmp_path), str(ROOT / "sweeps"))
    assert r.exit_code == 0, r.output
    assert "2 entries" in r.stdout and "nemotron-nano" in r.stdout
    r = run("show", str(good))
    assert r.exit_code == 0 and "gated_norm_bwd" in r.stdout and "NVIDIA H200" in r.stdout
    r = run("show", str(good), "--json")
    assert json.loads(r.stdout)["schema_version"] == 1
    assert "adopted from" not in run("show", str(good)).stdout
    # An entry whose config was adopted from a sibling SKU's (no search) says so in the search column.
    e = entry()
    adopted = tmp_path / "h100" / "adopted.json"
    write_bundle(bundle(e.model_copy(update={"search": e.search.model_copy(update={"adopted_from": "h200"})}),
                        gpu=H100), adopted)
    r = run("validate", str(adopted))
    assert r.exit_code == 0, r.output
    r = run("show", str(adopted))
    assert r.exit_code == 0 and "adopted from h200 (no search)" in " ".join(r.stdout.split()), r.stdout


def test_validate_rejects_unknown_kernel_and_bad_json(tmp_path):
    p = tmp_path / "b.json"
    write_bundle(bundle(entry()), p)
    data = json.loads(p.read_text())
    (key, e), = data["entries"].items()
    e["dims"]["width"] = 3
    data["entries"] = {key.replace("weight_fp32=1", "weight_fp32=1,width=3"): e}
    p.write_text(json.dumps(data))
    r = run("validate", str(p))
    assert r.exit_code == 2 and "dims: expected exactly" in r.stderr
    p.write_text("[1, 2")
    r = run("validate", str(p))
    assert r.exit_code == 2 and "not valid JSON" in r.stderr
    r = run("show", str(tmp_path / "missing.json"))
    assert r.exit_code == 2


def test_sweep_origin_that_matches_nothing_is_an_input_error(tmp_path):
    r = run("sweep", str(ROOT / "tests/data/tiny.yaml"), "-o", str(tmp_path / "out"), "--origin", "tp=8")
    assert r.exit_code == 2
    assert "--origin tp=8: no combo of" in r.output and "mamba-tune plan" in r.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args,needle", [
    (["sweep", "tests/data/tiny.yaml", "--timeout", "0"], "Invalid value for '--timeout'"),
    (["plan", "no-such-spec.yaml"], "'no-such-spec.yaml' does not exist"),
    (["no-such-command"], "No such command 'no-such-command'"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, needle):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "autotune_cli", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "--help" in lines[0], r.stderr


def test_bench_results_are_rewritten_whole_after_each_model(tmp_path):
    from autotune_cli.benchmarks.cli import write_results

    path = tmp_path / "out" / "bench.json"
    header = {"machine": "m", "copy_gbps": 1.0}
    write_results(path, header, [{"model": "a"}], complete=False)
    first = json.loads(path.read_text())
    assert first["complete"] is False and [r["model"] for r in first["rows"]] == ["a"]
    write_results(path, header, [{"model": "a"}, {"model": "b"}], complete=True)
    last = json.loads(path.read_text())
    assert last["complete"] is True and [r["model"] for r in last["rows"]] == ["a", "b"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["bench.json"]  # no temp file left


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU message")
def test_bench_without_a_gpu_is_a_one_line_error(tmp_path):
    out = tmp_path / "bench.json"
    r = run("bench", "--family", "ssd", "--model", "nemotron-3-nano-30b", "--json-out", str(out))
    assert r.exit_code == 2
    assert "no CUDA GPU" in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--family", "ssd", "--ssd-stage", "totl"], "--ssd-stage 'totl': unknown; known: chunk_cumsum"),
    (["--family", "norm", "--ssd-stage", "total"], "--ssd-stage: only with --family ssd or all"),
])
def test_bench_rejects_bad_stage_arguments_before_touching_a_gpu(tmp_path, args, message):
    out = tmp_path / "bench.json"
    r = run("bench", *args, "--json-out", str(out))
    assert r.exit_code == 2
    assert message in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize("args,message", [
    (["--name", "../escape"], "--name '../escape' is not a safe file name"),
    (["--name", "{tmp}/abs"], "/abs' is not a safe file name"),
    (["--dims", "batch=1,seqlen=64,ngroups=1,dstate=16,chunk_size=24"],
     "--dims: chunk_size=24: the kernels need a power of two in 16..256"),
    (["--dims", "batch=4096,seqlen=1048576,ngroups=8,dstate=128,chunk_size=64"],
     "--dims: B (batch, seqlen, ngroups, dstate) has 4,398,046,511,104 elements, over 2**31 - 1"),
])
def test_tune_rejects_unsafe_names_and_impossible_dims_writing_nothing(tmp_path, args, message):
    out = tmp_path / "out"
    base = ["tune", "ssd_bmm", "--dims", "batch=1,seqlen=64,ngroups=1,dstate=16,chunk_size=16", "--cpu-dry-run",
            "-o", str(out), "--log-dir", str(tmp_path / "logs")]
    if args[0] == "--dims":
        base[3] = args[1]
    else:
        base += [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = run(*base)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no bundle, lock or log anywhere


MARKUP = "[bold]x[/x]"  # rich reads both as markup: the first styles, the second raises MarkupError


def test_show_and_validate_print_markup_in_data_as_text(tmp_path):
    from mamba_tune.bundle import Failure

    b = bundle(entry())
    fail = Failure(kernel="gated_norm_bwd", dims=norm_dims(rows=8), dtype="bf16", reason=f"boom {MARKUP} end",
                   at="2026-11-29T00:00:00+00:00")
    b = b.with_failure(fail, updated="2026-11-29T00:00:00+00:00")
    p = tmp_path / MARKUP / "b.json"
    write_bundle(b, p)
    r = run("show", str(p))
    assert r.exit_code == 0, r.output
    assert f"boom {MARKUP} end" in r.stdout and f"{p}: NVIDIA H200" in r.stdout
    r = run("validate", str(p))
    assert r.exit_code == 0, r.output
    assert f"ok  {p}: bundle" in r.stdout


def test_plan_prints_markup_in_model_names_as_text(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text((ROOT / "tests/data/tiny.yaml").read_text().replace("name: tiny-model", f"name: '{MARKUP}'"))
    r = run("plan", str(spec))
    assert r.exit_code == 0, r.output
    assert f"{MARKUP} tp=1 batch=1 seqlen=64" in r.stdout


def test_tune_progress_and_summary_print_markup_in_reasons_and_paths_as_text(tmp_path):
    # A 1 s timeout fails the combo for real (the worker needs longer to start); the
    # failure reason names the log, whose path holds markup.
    logs = tmp_path / f"logs{MARKUP}"
    out = tmp_path / f"out{MARKUP}"
    dims = "rows=8,d=64,group_size=64,has_z=0,norm_before_gate=0,has_bias=0,is_rms=1,weight_fp32=1"
    r = run("tune", "gated_norm_fwd", "--dims", dims, "--cpu-dry-run", "--timeout", "1", "-o", str(out),
            "--log-dir", str(logs))
    assert r.exit_code == 1, r.output
    failed = [ln for ln in r.stderr.splitlines() if "FAILED" in ln]
    assert len(failed) == 1 and "worker timed out" in failed[0] and f"{logs}/cpu/adhoc/" in failed[0], r.stderr
    assert "FAILED: worker timed out" in r.stdout and MARKUP in r.stdout
    assert f"combo(s) failed; reasons are recorded under 'failures' in {out}/cpu/adhoc.json" in r.stderr


def test_output_under_a_regular_file_is_one_line_exit_2(tmp_path):
    (tmp_path / "file").write_text("")
    dims = "rows=8,d=64,group_size=64,has_z=0,norm_before_gate=0,has_bias=0,is_rms=1,weight_fp32=1"
    r = run("tune", "gated_norm_fwd", "--dims", dims, "--cpu-dry-run", "-o", str(tmp_path / "file" / "out"),
            "--log-dir", str(tmp_path / "logs"))
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [f"error: cannot write {tmp_path}/file/out/cpu: Not a directory "
                                             "(combos finished before it are kept in the bundle)"]
    good = tmp_path / "b.json"
    write_bundle(bundle(entry()), good)
    r = run("report", str(good), "-o", str(tmp_path / "file" / "report"))
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines() == [f"error: cannot write the report: {tmp_path}/file/report: Not a directory"]


def test_a_full_disk_mid_sweep_is_one_line_and_keeps_finished_combos(tmp_path):
    """A real write failure: the sweep runs with a file size limit (RLIMIT_FSIZE, SIGXFSZ
    ignored) that lets the first bundle write through and fails the second (EFBIG, as a
    full disk fails with ENOSPC): exit 2, one line, the first combo kept."""
    import resource
    import signal
    import subprocess
    import sys

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4000, 4000))

    out = tmp_path / "out"
    r = subprocess.run([sys.executable, "-m", "autotune_cli", "sweep", "tests/data/tiny.yaml", "--cpu-dry-run",
                        "--kernel", "gated_norm_fwd", "--origin", "seqlen=64", "-o", str(out),
                        "--log-dir", str(tmp_path / "logs")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, preexec_fn=limit)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (f"error: cannot write under {out}: File too large (combos "
                                                 "finished before it are kept in the bundle)"), r.stderr
    assert "Traceback" not in r.stderr
    from mamba_tune.bundle import load_bundle

    kept = load_bundle(out / "cpu" / "tiny.json")
    assert len(kept.entries) == 1
    assert sorted(p.name for p in (out / "cpu").iterdir()) == ["tiny.json", "tiny.json.lock"]  # no temp file left


COMMANDS = ("plan", "sweep", "tune", "validate", "show", "diff", "check", "verify", "report", "bench", "results",
            "searches")


def test_help_shows_no_type_noise_and_names_every_value(monkeypatch):
    import re

    monkeypatch.setenv("COLUMNS", "250")
    every = [name for name, _cb in _callbacks(app)]
    assert set(COMMANDS) <= set(every)
    for args in ([], *([c] for c in every)):
        r = run(*args, "--help")
        assert r.exit_code == 0, (args, r.output)
        noise = re.findall(r"<(?:bool|str|int|float|file|dir|path|list\[[^\]]*\])[^>]*>", r.stdout)
        assert not noise, (args, noise)
        assert "<gpu sku>" not in r.stdout and "OUT/" not in r.stdout, args


def test_version_prints_the_package_version():
    import importlib.metadata

    r = run("--version")
    assert r.exit_code == 0, r.output
    assert r.stdout == f"mamba-tune {importlib.metadata.version('mamba-tune')}\n"
def test_validate_lists_configs_helion_rejects(tmp_path):
    """Every config is checked against its kernel's config space at its dims, on the CPU:
    a list of the wrong length for the kernel exits 1 naming the entry. (A value no config
    may hold fails the bundle's load: tests/runtime/test_bundle_config_safety.py.)"""
    p = tmp_path / "b.json"
    dims = norm_dims(rows=64, d=64, group_size=32)
    good = entry(dims=dims)
    bad = [entry(dims=norm_dims(rows=32, d=64, group_size=32),
                 config={"block_sizes": [8, 1], "load_eviction_policies": ["first"] * 9}),
           entry("gated_norm_bwd", dims=dims, config={"block_sizes": [8, 1]}),
           entry(dims=norm_dims(rows=16, d=64, group_size=32), config={"block_sizes": [8, 1], "indexing": ["pointer"]})]
    write_bundle(bundle(good, *bad), p)
    ok = tmp_path / "ok.json"
    write_bundle(bundle(good), ok)
    r = run("validate", str(p), str(ok))
    assert r.exit_code == 1, r.output
    assert "1/4 configs valid" in r.stdout
    # The failed file's summary says so (never `ok`); the good one's is ok; progress on stderr.
    summary = {line.split()[1]: line.split()[0] for line in r.stdout.splitlines()}
    assert summary == {f"{p}:": "FAILED", f"{ok}:": "ok"}, r.stdout
    assert f"[1/2] checking {p}" in r.stderr and f"[2/2] checking {ok}" in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if "Helion rejects the config" in line]
    assert sorted(line.split(": ")[1] for line in lines) == sorted(e.key for e in bad), r.stderr
    assert any("load_eviction_policies: must be a list of 8 values for this kernel, got 9" in line for line in lines)
    assert any("expected 3 block sizes" in line for line in lines)
    assert any("indexing: must be a list of 11 values for this kernel, got 1" in line for line in lines)
    write_bundle(bundle(good), p)
    r = run("validate", str(p))
    assert r.exit_code == 0 and "1/1 configs valid" in r.stdout, r.output


def _callbacks(typer_app):
    for c in typer_app.registered_commands:
        yield c.name or c.callback.__name__, c.callback
    for g in typer_app.registered_groups:
        yield from _callbacks(g.typer_instance)


def test_every_option_whose_metavar_spells_its_name_declares_the_name():
    # typer 0.27.x names an option that declares no name after its metavar when the two match
    # ignoring case: metavar="KERNEL" on `kernel` became --KERNEL, and `--kernel` answered "No such
    # option" (seen on the H200, typer 0.27.2). Declaring the name sidesteps that on every typer.
    import typing

    from typer.models import OptionInfo

    undeclared = []
    for name, cb in _callbacks(app):
        for param, hint in typing.get_type_hints(cb, include_extras=True).items():
            for info in getattr(hint, "__metadata__", ()):
                # In Annotated[..., typer.Option("--name")] typer takes the first argument, stored
                # as the default, for the name.
                declared = info.param_decls or isinstance(info.default, str) and info.default.startswith("-")
                if isinstance(info, OptionInfo) and not declared and (info.metavar or "").lower() == param.lower():
                    undeclared.append(f"{name} {param}")
    assert not undeclared, undeclared
    assert len(list(_callbacks(app))) > 5


def test_output_piped_to_a_reader_that_stops_early_exits_0_quietly(tmp_path):
    """`mamba-tune plan SPEC | head -1`: the reader closes the pipe; the command ends with
    exit code 0 and nothing on stderr (rich and click would each exit 1)."""
    import subprocess
    import sys

    spec = tmp_path / "s.yaml"
    seqlens = ", ".join(str(16 * i) for i in range(1, 61))
    spec.write_text((ROOT / "tests/data/tiny.yaml").read_text()
                    .replace("seqlen: [64, 40]", f"seqlen: [{seqlens}]")
                    .replace("kernels: [gated_norm_fwd, gated_norm_bwd]", "kernels: all"))
    for extra in ([], ["--json"]):
        p = subprocess.Popen([sys.executable, "-m", "autotune_cli", "plan", str(spec), *extra], cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout is not None and p.stdout.readline()
        p.stdout.close()  # more than a pipe's buffer (64 KiB) is still to come
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 0 and stderr == b"", (extra, p.returncode, stderr[-2000:])


def test_a_truncated_bundle_is_one_complete_line(tmp_path):
    """The line number is printed as is (rich read ':100:' as an emoji code), with the column
    and what was expected."""
    p = tmp_path / "b.json"
    p.write_text("{" + "\n" * 99 + '  "entr')
    r = run("validate", str(p))
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: {p}:100:3: not valid JSON: expecting '\"' to close the string that starts here "
        "(the file ends before it: truncated?)"), r.stderr


def test_sweep_refuses_a_bad_spec_before_importing_torch(tmp_path):
    """`sweep` checks the spec first, as `validate` does: no torch import (10+ s) for a typo."""
    import subprocess
    import sys

    spec = tmp_path / "bad.yaml"
    spec.write_text((ROOT / "tests/data/tiny.yaml").read_text().replace("batch: [1]", "bacth: [1]"))
    code = ("import sys\nfrom autotune_cli.app import main\n"
            f"sys.argv = ['mamba-tune', 'sweep', {str(spec)!r}, '--cpu-dry-run']\n"
            "try:\n    main()\nexcept SystemExit as e:\n    print('exit', e.code)\n"
            "print('imported:', *sorted(m for m in ('torch', 'helion', 'autotune_cli.sweep') if m in sys.modules))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.stdout.splitlines() == ["exit 2", "imported:"], r.stdout + r.stderr
    assert "unknown key 'bacth'; did you mean 'batch'?" in r.stderr
