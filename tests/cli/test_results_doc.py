"""docs/results.md is what `mamba-tune results benchmarks/results` writes (it cannot drift from the
result files), every figure is labelled with its card, and a bad result file is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.benchmarks.results import ResultsError, load_results, render

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "results.md"

MACHINE = {"h200": "NVIDIA H200 (132 SMs), torch 2.11.0+cu130", "h100": "NVIDIA H100 80GB HBM3 (132 SMs), torch 2.11.0"}


def run(*args: str):  # noqa: ANN202 - click's Result
    return CliRunner().invoke(app, list(args))


def bench_file(folder: Path, name: str, card: str, rows: list[dict], time: str = "2026-01-01T00:00:00+00:00",
               **extra) -> Path:
    path = folder / name
    path.write_text(json.dumps({"machine": MACHINE[card], "time": time, "config_mode": "nearest", "complete": True,
                                "rows": rows, **extra}), encoding="utf-8")
    return path


def ssd_row(model: str, stage: str, ours: float, theirs: float) -> dict:
    return {"family": "ssd", "model": model, "stage": stage, "ours_ms": ours, "baseline_ms": theirs,
            "configs": {"a|x=1|bf16": "exact /b.json", "b|x=1|bf16": "default"}}


def test_the_committed_document_is_what_the_command_writes(tmp_path: Path) -> None:
    assert render(load_results(RESULTS), "benchmarks/results") == DOC.read_text(encoding="utf-8"), (
        "docs/results.md is stale: run `mamba-tune results benchmarks/results -o docs/results.md`")
    r = run("results", str(RESULTS), "-o", str(tmp_path / "results.md"))
    assert r.exit_code == 0, r.output
    assert (tmp_path / "results.md").read_text(encoding="utf-8") == DOC.read_text(encoding="utf-8").replace(
        "benchmarks/results", RESULTS.as_posix())


def test_every_result_file_is_in_the_document_with_its_card() -> None:
    text = DOC.read_text(encoding="utf-8")
    for path in sorted(RESULTS.glob("*.json")):
        card = path.name.split("-")[0].upper()
        assert f"### {path.name}\n\nCard: {card} (" in text, path.name


def test_check_says_whether_the_document_is_up_to_date(tmp_path: Path) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    bench_file(folder, "h200-ssd.json", "h200", [ssd_row("mamba2-2.7b", "fwd_bwd_graph", 2.0, 3.0)])
    doc = tmp_path / "results.md"
    assert run("results", str(folder), "-o", str(doc)).exit_code == 0
    r = run("results", str(folder), "-o", str(doc), "--check")
    assert r.exit_code == 0 and "up to date" in r.output
    bench_file(folder, "h200-ssd.json", "h200", [ssd_row("mamba2-2.7b", "fwd_bwd_graph", 2.0, 3.3)])
    before = doc.read_text(encoding="utf-8")
    r = run("results", str(folder), "-o", str(doc), "--check")
    assert r.exit_code == 1 and "regenerate" in r.output
    assert doc.read_text(encoding="utf-8") == before  # --check writes nothing


def test_each_card_gets_its_own_summary_rows_and_ratios_against_mamba_ssm(tmp_path: Path) -> None:
    bench_file(tmp_path, "h200-ssd-old.json", "h200", [ssd_row("mamba2-2.7b", "fwd_bwd_graph", 3.0, 3.0)],
               time="2026-01-01T00:00:00+00:00")
    bench_file(tmp_path, "h200-ssd-new.json", "h200", [ssd_row("mamba2-2.7b", "fwd_bwd_graph", 2.0, 3.0)],
               time="2026-02-01T00:00:00+00:00")
    bench_file(tmp_path, "h100-ssd.json", "h100", [ssd_row("mamba2-2.7b", "fwd_bwd_graph", 4.0, 5.0)])
    # A run in another lookup mode is not the current figure, however new.
    bench_file(tmp_path, "h200-ssd-exact.json", "h200", [ssd_row("mamba2-2.7b", "fwd_bwd_graph", 9.0, 3.0)],
               time="2026-03-01T00:00:00+00:00", config_mode="exact")
    text = render(load_results(tmp_path), "r")
    summary = text.split("## Summary")[1].split("Reproduce")[0]
    assert "| H100 | mamba2-2.7b | - | **1.25x** (4.000 / 5.000) |" in summary  # no module step: "-"
    assert "| H200 | mamba2-2.7b | - | **1.50x** (2.000 / 3.000) |" in summary
    assert "| mamba2-2.7b | fwd_bwd_graph | H200 | 2.000 ms | 3.000 ms | 1.50x | 1 default, 1 exact | h200-ssd-new.json |" in text
    assert "### h200-ssd-exact.json\n\nCard: H200 (NVIDIA H200 (132 SMs), torch 2.11.0+cu130). Lookup mode: exact." in text


@pytest.mark.parametrize("name, content, message", [
    ("ssd.json", {}, "a result file is named CARD-WHAT.json"),
    ("h200-x.json", "{not json", "not a readable JSON file"),
    ("h200-x.json", [1], "a result file is a JSON object"),
    ("h200-x.json", {"rows": []}, "neither `mamba-tune bench --json-out` rows"),
    ("h100-x.json", {"machine": MACHINE["h200"], "rows": []}, "named for card 'h100' but measured on"),
    ("h200-x.json", {"machine": MACHINE["h200"], "rows": [{"family": "ssd", "model": "m", "stage": "s"}]},
     "rows[0].ours_ms: expected a finite number, got None"),
    ("h200-x.json", {"machine": MACHINE["h200"], "rows": [{"family": "ssd", "model": "m", "ours_ms": 1.0}]},
     "rows[0]: a bench row needs 'family', 'model' and 'stage' (or 'op')"),
])
def test_a_bad_result_file_is_one_line_exit_2_and_nothing_written(tmp_path: Path, name: str, content, message: str) -> None:
    folder = tmp_path / "r"
    folder.mkdir()
    bench_file(folder, "h200-good.json", "h200", [ssd_row("mamba2-2.7b", "total", 1.0, 2.0)])
    (folder / name).write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    with pytest.raises(ResultsError, match="^" + str(folder / name).replace("\\", "\\\\")):
        load_results(folder)
    doc = tmp_path / "results.md"
    r = run("results", str(folder), "-o", str(doc))
    assert r.exit_code == 2, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not doc.exists() and list(tmp_path.iterdir()) == [folder]


def test_an_empty_folder_and_check_without_a_file_are_errors(tmp_path: Path) -> None:
    r = run("results", str(tmp_path))
    assert r.exit_code == 2 and "no result files" in r.output
    r = run("results", str(RESULTS), "--check")
    assert r.exit_code == 2 and "--check needs -o FILE" in r.output


def test_a_row_measured_as_none_is_left_out(tmp_path: Path) -> None:
    """`bench` writes ours_ms None for a row it could not measure (a step no CUDA graph captured):
    the document leaves that row out and keeps the file's others."""
    none = {**ssd_row("mamba2-2.7b", "fwd_bwd_graph", 2.0, 3.0), "ours_ms": None}
    bench_file(tmp_path, "h200-x.json", "h200", [none, ssd_row("mamba2-2.7b", "total_graph", 1.0, 2.0)])
    (f,) = load_results(tmp_path)
    assert [r.label for r in f.rows] == ["total_graph"]


def test_the_readmes_results_table_is_the_documents_summary() -> None:
    # The README quotes the summary's rows under a marker; each must be in docs/results.md's
    # summary as it is (regenerate both when a figure changes).
    readme = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(readme) if line.startswith("<!-- the summary of docs/results.md"))
    rows = []
    for line in readme[start + 1:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    summary = DOC.read_text(encoding="utf-8").split("## Summary")[1].split("\n## ")[0].splitlines()
    assert len(rows) >= 4
    assert [r for r in rows if r not in summary] == []


def test_a_row_at_another_shape_is_labelled_and_never_replaces_the_reference_shapes(tmp_path: Path) -> None:
    # A module step at batch 8 x 2048, measured after the batch 2 x 8192 one, is its own row
    # ("nemotron-3-nano-30b b8 L2048"); the reference shape's row keeps its figure.
    def module_row(ours: float, theirs: float) -> dict:
        return {"family": "module", "model": "nemotron-3-nano-30b", "stage": "module_train_step_mem_eff",
                "ours_ms": ours, "baseline_ms": theirs}

    bench_file(tmp_path, "h100-module-ref.json", "h100", [module_row(8.0, 10.0)], batch=2, seqlen=8192)
    bench_file(tmp_path, "h100-module-b8.json", "h100", [module_row(9.0, 9.9)], time="2026-02-01T00:00:00+00:00",
               batch=8, seqlen=2048)
    text = render(load_results(tmp_path), "r")
    newest = text.split("## Newest figure of each row", 1)[1]
    assert "| nemotron-3-nano-30b | module_train_step_mem_eff | H100 | 8.000 ms | 10.000 ms | 1.25x |" in newest
    assert "| nemotron-3-nano-30b b8 L2048 | module_train_step_mem_eff | H100 | 9.000 ms | 9.900 ms | 1.10x |" in newest
