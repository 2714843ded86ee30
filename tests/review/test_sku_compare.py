"""`mamba-tune verify BUNDLE --against OTHER`: which bundles compare, the rows and the summary
per kernel on the CPU; the real run of both configs on the GPU (`pytest -m gpu`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import review_fixtures as fx
import torch
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.review.sku_compare import against_problem, geomean, markdown, summarize
from autotune_cli.review.verify import Against, EntryResult, Margins, VerifyResult

runner = CliRunner()
TINY = Path(__file__).resolve().parent.parent / "data" / "tiny.yaml"
B200 = fx.GpuInfo(name="NVIDIA B200", sku="b200", arch="sm100", compute_capability="10.0", sm_count=148)


def two_bundles(tmp_path: Path, other_gpu: fx.GpuInfo = fx.H200) -> tuple[Path, Path]:
    """An H100 bundle with two norm entries and a bundle of `other_gpu` sharing one key."""
    shared, ours_only, theirs_only = (fx.entry(dims=fx.norm_dims(r)) for r in (16384, 8192, 4096))
    ours = fx.write(fx.bundle([shared, ours_only], gpu=fx.H100), tmp_path / "h100" / "nano.json")
    other = fx.write(fx.bundle([shared, theirs_only], gpu=other_gpu), tmp_path / other_gpu.sku / "nano.json")
    return ours, other


def test_only_a_sibling_skus_bundle_compares() -> None:
    assert against_problem(fx.H100, fx.H200) is None
    assert against_problem(fx.H200, fx.H100) is None
    msg = against_problem(fx.H100, B200)
    assert msg is not None and "tuned on b200 (sm100)" in msg and "h100 (sm90)" in msg and "(gh200, h200)" in msg
    msg = against_problem(fx.H100, fx.H100)
    assert msg is not None and "as the bundle verified is" in msg and "mamba-tune diff" in msg


@pytest.mark.parametrize("case", ["other-arch", "same-sku", "unreadable", "missing"])
def test_a_bad_against_is_one_line_exit_2_before_any_gpu_work(tmp_path: Path, case: str) -> None:
    ours, other = two_bundles(tmp_path, B200 if case == "other-arch" else fx.H100 if case == "same-sku" else fx.H200)
    if case == "unreadable":
        other.write_text('{"schema_version": 1, "entries": [}')
    elif case == "missing":
        other = tmp_path / "nope.json"
    res = runner.invoke(app, ["verify", str(ours), "--against", str(other), "--json-out", str(tmp_path / "v.json")])
    assert res.exit_code == 2, res.output
    want = {"other-arch": f"--against {other}: tuned on b200 (sm100)", "same-sku": "tuned on h100, as the bundle",
            "unreadable": f"--against: {other}", "missing": "does not exist"}[case]
    assert want in " ".join(res.stderr.split()), res.stderr
    if case != "missing":  # typer's own box for a missing path spans lines
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert not (tmp_path / "v.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_a_sibling_bundle_is_accepted_and_the_gpu_is_still_required(tmp_path: Path) -> None:
    ours, other = two_bundles(tmp_path)
    res = runner.invoke(app, ["verify", str(ours), "--against", str(other)])
    assert res.exit_code == 2 and "no CUDA GPU visible" in res.stderr and "NVIDIA H100" in res.stderr


def results() -> VerifyResult:
    """A run of three entries as verify reports it (the GPU run itself is test_against_on_gpu)."""
    a = EntryResult("gated_norm_fwd|rows=1|bf16", True, [], 0.1, 0.15, tuned_ms=0.10, default_ms=0.15,
                    baseline_ms=0.20, baseline="mamba-ssm", in_other=True, other_ms=0.12)
    b = EntryResult("gated_norm_fwd|rows=2|bf16", True, [], 0.1, 0.15, tuned_ms=0.20, default_ms=0.20,
                    same_as_default=True, in_other=True, other_ms=0.20, same_as_other=True)
    c = EntryResult("gated_norm_bwd|rows=1|bf16", True, [], 0.1, 0.15, tuned_ms=0.30, default_ms=0.60,
                    baseline_ms=0.90, baseline="mamba-ssm", in_other=True,
                    other_reasons=["does not compile: CompileError: [bad] tile"])
    failed = EntryResult("gated_norm_bwd|rows=2|bf16", False, ["does not compile: CompileError: x"], 0.1, 0.15,
                         in_other=True)
    against = Against("h200/nano.json", fx.H200, only_ours=[], only_other=["gated_norm_fwd|rows=3|bf16"])
    return VerifyResult(gpu=fx.H100, versions=fx.VERSIONS, bundle_gpu=fx.H100, bundle_versions=fx.VERSIONS,
                        margins=Margins(), started="2026-12-06T00:00:00+00:00", results=[a, b, c, failed],
                        against=against)


def test_the_json_rows_carry_both_sides_the_ratios_and_the_card() -> None:
    data = json.loads(json.dumps(results().to_json("h100/nano.json"), allow_nan=False))
    assert data["against"]["bundle"] == "h200/nano.json" and data["against"]["gpu"]["sku"] == "h200"
    assert data["against"]["only_other"] == ["gated_norm_fwd|rows=3|bf16"] and data["against"]["only_ours"] == []
    a, b, c, failed = data["entries"]
    assert a["kernel"] == "gated_norm_fwd" and a["card"] == "h100" and c["kernel"] == "gated_norm_bwd"
    assert (a["tuned_ms"], a["other_ms"], a["default_ms"], a["baseline_ms"]) == (0.10, 0.12, 0.15, 0.20)
    assert a["vs_other"] == pytest.approx(1.2) and a["vs_default"] == pytest.approx(1.5)
    assert a["vs_baseline"] == pytest.approx(2.0)
    assert b["same_as_other"] and b["vs_other"] == 1.0
    assert c["other_ms"] is None and c["vs_other"] is None and c["other_reasons"][0].startswith("does not compile")
    assert failed["tuned_ms"] is None and failed["vs_other"] is None and failed["in_other"]
    # A verify run without --against keeps its JSON as before: no against block.
    plain = VerifyResult(**{**results().__dict__, "against": None}).to_json("h100/nano.json")
    assert "against" not in plain


def test_the_summary_per_kernel_and_overall() -> None:
    rows = [r.to_json() for r in results().results]
    bwd, fwd, everything = summarize(rows)
    assert (fwd.kernel, fwd.entries, fwd.compared, fwd.same_config, fwd.other_failed) == ("gated_norm_fwd", 2, 2, 1, 0)
    assert fwd.vs_other == pytest.approx(math.sqrt(1.2)) and (fwd.vs_other_min, fwd.vs_other_max) == (1.0, 1.2)
    assert fwd.vs_default == pytest.approx(math.sqrt(1.5)) and fwd.vs_baseline == pytest.approx(2.0)
    assert (bwd.entries, bwd.compared, bwd.other_failed, bwd.vs_other, bwd.vs_default) == (2, 0, 1, None, 2.0)
    assert everything.kernel == "all" and everything.entries == 4 and everything.compared == 2
    assert everything.vs_default == pytest.approx(geomean([1.5, 1.0, 2.0]))
    assert everything.vs_baseline == pytest.approx(geomean([2.0, 3.0]))
    assert [s.kernel for s in summarize(rows[:2])] == ["gated_norm_fwd"]  # one kernel: no "all" row
    lines = markdown("h100", "h200", "nano", [fwd, everything])
    assert fx.assert_md_tables("\n".join(lines)) == 1
    assert lines[2] == ("| H100 | nano | h200 entries | gated_norm_fwd | 2 | 2 | 1 | 0 | 1.095x | 1.000x | 1.200x "
                        "| 1.225x | 2.000x |")
    assert lines[3].startswith("| H100 | nano | h200 entries | **all** | **4** |")


def test_the_terminal_tables() -> None:
    from rich.console import Console

    from autotune_cli.commands.review import _against_table, _verify_table

    con = Console(width=300, record=True)
    con.print(_verify_table(results(), "h100/nano.json"))
    con.print(_against_table(results(), "h100/nano.json"))
    text = con.export_text()
    assert "h200 entry ms" in text and "0.1200" in text and "1.20x" in text
    assert "sibling's entry: does not compile: CompileError: [bad] tile" in text  # plain text, not markup
    assert "h100/nano.json (h100) against h200/nano.json (h200)" in text
    assert "1.095x" in text and "all" in text


# --- docs/results.md: `mamba-tune results` renders the reports ------------------------------


def write_report(folder: Path, name: str = "h100-verify-nano-vs-h200.json", **change: object) -> Path:
    data = results().to_json("generated_configs/h100/nano.json")
    data.update(change)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    return folder / name


def test_results_renders_a_table_per_against_report(tmp_path: Path) -> None:
    from autotune_cli.benchmarks.results import load_results, render

    write_report(tmp_path / "r")
    text = render(load_results(tmp_path / "r"), "r")
    section = text.split("## What tuning per SKU buys")[1].split("\n## ")[0]
    assert fx.assert_md_tables(section) == 1
    assert "| H100 | nano | h200 entries | gated_norm_fwd | 2 | 2 | 1 | 0 | 1.095x | 1.000x | 1.200x |" in section
    assert "| H100 | nano | h200 entries | **all** | **4** | **2** |" in section
    assert "h100-verify-nano-vs-h200.json (NVIDIA H100 80GB HBM3): 0 keys only in the H100 bundle, 1 only in " \
           "the H200 one." in section
    assert "Not measured yet" not in section
    # The entry that failed before it was timed is in the summary's counts, not in the file's rows.
    rows = text.split("### h100-verify-nano-vs-h200.json")[1]
    assert rows.count("(verify) |") == 3
    # The same command, regenerating a document, writes it.
    doc = tmp_path / "results.md"
    res = runner.invoke(app, ["results", str(tmp_path / "r"), "-o", str(doc)])
    assert res.exit_code == 0, res.output
    assert doc.read_text() == render(load_results(tmp_path / "r"), (tmp_path / "r").as_posix())


@pytest.mark.parametrize(("change", "message"), [
    ({"against": {"bundle": "x.json"}}, "against: needs the sibling bundle's gpu.sku, only_ours and only_other"),
    ({"entries": [{"key": "gated_norm_fwd|rows=1|bf16", "tuned_ms": 0.1}]}, "entries[0]: a row of a `verify --against` "
                                                                           "report needs its 'kernel'"),
    ({"entries": [{"key": "k|a=1|bf16", "kernel": "k", "tuned_ms": 0.1, "vs_other": 0}]},
     "entries[0].vs_other: a speedup is positive, got 0"),
], ids=["against", "kernel", "ratio"])
def test_a_bad_against_report_is_one_line_exit_2(tmp_path: Path, change: dict, message: str) -> None:
    path = write_report(tmp_path / "r", **change)
    doc = tmp_path / "results.md"
    res = runner.invoke(app, ["results", str(tmp_path / "r"), "-o", str(doc)])
    assert res.exit_code == 2 and f"{path}: {message}" in " ".join(res.output.split()), res.output
    assert len(res.output.strip().splitlines()) == 1 and not doc.exists()


# --- on the GPU -------------------------------------------------------------------------


@pytest.mark.gpu
def test_against_on_gpu(tmp_path: Path) -> None:
    """Two real bundles of the tiny spec's norm combos: this GPU's (the default configs, effort
    none) and a sibling SKU's with another config for one key and a config that cannot compile
    for the other. verify --against times both sides of each key in one process."""
    from autotune_cli import environment as env
    from autotune_cli.plan import plan
    from autotune_cli.spec import load_spec
    from autotune_cli.tuner import tune
    from mamba_tune.bundle import Bundle, KernelProvenance, Provenance, write_bundle
    from mamba_tune.sku import siblings

    spec = load_spec(TINY)
    budget = spec.budget.model_copy(update={"effort": "none"})
    combos = plan(spec)[:2]  # one fwd, one bwd
    outcomes = [tune(c.kernel, c.dims, c.dtype, budget, spec.tolerances[c.dtype]) for c in combos]
    assert all(o.entry is not None for o in outcomes), [o.failure for o in outcomes]
    here = env.gpu_info()
    sibling = here.model_copy(update={"sku": siblings(here.sku)[0], "name": f"NVIDIA {siblings(here.sku)[0].upper()}"})
    prov = Provenance(tool_version=env.tool_version(), created=env.now(), updated=env.now(), gpu=here,
                      versions=env.versions(), kernels={c.kernel: KernelProvenance(source_sha256=o.kernel.source_sha256)
                                                        for c, o in zip(combos, outcomes, strict=True)})
    fwd, bwd = (o.entry for o in outcomes)
    assert fwd is not None and bwd is not None
    ours = Bundle(provenance=prov, entries={fwd.key: fwd, bwd.key: bwd})
    warps = 8 if fwd.config.get("num_warps") != 8 else 4
    other_fwd = fwd.model_copy(update={"config": fwd.config | {"num_warps": warps}})
    broken = bwd.model_copy(update={"config": bwd.config | {"block_sizes": [*bwd.config["block_sizes"], 16]}})
    theirs = Bundle(provenance=prov.model_copy(update={"gpu": sibling}),
                    entries={other_fwd.key: other_fwd, broken.key: broken})
    write_bundle(ours, tmp_path / "ours.json")
    write_bundle(theirs, tmp_path / "theirs.json")
    res = runner.invoke(app, ["verify", str(tmp_path / "ours.json"), "--against", str(tmp_path / "theirs.json"),
                              "--json-out", str(tmp_path / "v.json"), "--regression-pct", "1000"])
    assert res.exit_code == 0, res.output  # the sibling's broken entry does not fail ours
    data = json.loads((tmp_path / "v.json").read_text())
    rows = {e["key"]: e for e in data["entries"]}
    assert data["against"]["gpu"]["sku"] == sibling.sku and data["against"]["only_other"] == []
    f, b = rows[fwd.key], rows[bwd.key]
    assert f["in_other"] and not f["same_as_other"] and f["other_ms"] > 0
    assert f["vs_other"] == pytest.approx(f["other_ms"] / f["tuned_ms"]) and f["card"] == here.sku
    assert b["in_other"] and b["other_ms"] is None and b["other_reasons"], b
    assert "vs sibling" in res.stdout and "gated_norm_fwd" in res.stdout
