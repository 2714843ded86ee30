"""`mamba-tune report`: real PNGs (one per kernel) and a report.md that embeds them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import review_fixtures as fx
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.review.report import shape_labels

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def report_bundle() -> fx.Bundle:
    fwd = [fx.entry("gated_norm_fwd", fx.norm_dims(rows), tuned=0.1, default=0.1 * s, baseline=0.1 * b)
           for rows, s, b in ((4096, 1.2, 0.9), (8192, 1.5, 1.1), (16384, 2.0, 1.4))]
    bwd = [fx.entry("gated_norm_bwd", fx.norm_dims(rows, d=2048, group_size=256), tuned=0.2, default=0.3,
                    baseline=None) for rows in (4096, 8192)]
    return fx.bundle(fwd + bwd, [fx.failure("gated_norm_bwd", fx.norm_dims(1024), reason="worker timed out")])


def test_report_files(tmp_path: Path) -> None:
    from matplotlib.image import imread

    src = fx.write(report_bundle(), tmp_path / "h200" / "nano.json")
    out = tmp_path / "report"
    res = runner.invoke(app, ["report", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    pngs = {p.name: p for p in out.glob("*.png")}
    assert set(pngs) == {"speedup-gated_norm_fwd.png", "speedup-gated_norm_bwd.png"}
    for p in pngs.values():
        data = p.read_bytes()
        assert data[:8] == PNG_MAGIC
        assert len(data) > 10_000
        img = imread(p)
        # figsize (max(6, 1.3 n + 2.5), 4.8) inches at 110 dpi, RGBA.
        assert img.ndim == 3 and img.shape[2] == 4
        assert img.shape[0] == 528 and img.shape[1] >= 660
        assert img[..., :3].std() > 0.05  # not a blank canvas
        assert str(p) in res.stdout
    md = (out / "report.md").read_text()
    assert md.startswith("# Tuned configs: nemotron-nano on NVIDIA H200")
    for name in pngs:
        assert f"]({name})" in md
    assert "## gated_norm_fwd" in md and "## gated_norm_bwd" in md
    assert md.count("| bf16 |") == 5
    assert "| 2.00x | 1.40x |" in md  # the rows=16384 fwd entry: vs default, vs baseline
    assert "## Failures" in md and "worker timed out" in md
    assert "## Provenance" in md and "helion 1.5.0, torch 2.11.0+cu130, triton 3.6.0" in md
    assert "Geometric-mean speedup" in md
    assert fx.assert_md_tables(md) == 4  # two kernels, failures, provenance


def test_multi_line_failure_reasons_stay_in_their_table_cell(tmp_path: Path) -> None:
    reason = "worker exited with code 1\nTraceback:\r\n  File x | y\nboom"
    b = report_bundle()
    b = b.model_copy(update={"failures": {k: f.model_copy(update={"reason": reason}) for k, f in b.failures.items()}})
    src = fx.write(b, tmp_path / "h200" / "nano.json")
    res = runner.invoke(app, ["report", str(src), "-o", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "report" / "report.md").read_text()
    (row,) = [line for line in md.splitlines() if "worker exited" in line]
    assert row.endswith("| worker exited with code 1<br>Traceback:<br>  File x \\| y<br>boom |"), row
    assert fx.assert_md_tables(md) == 4


def test_shape_labels_show_the_dims_that_vary() -> None:
    es = [fx.entry(dims=fx.norm_dims(r, d=d)) for r, d in ((4096, 2048), (8192, 2048), (8192, 4096))]
    assert shape_labels(es) == ["rows=4096\nd=2048", "rows=8192\nd=2048", "rows=8192\nd=4096"]
    one = shape_labels(es[:1])[0]
    assert "rows=4096" in one and "weight_fp32=1" in one
    mixed = [fx.entry(dims=fx.norm_dims(4096)), fx.entry(dims=fx.norm_dims(4096), dtype="fp16")]
    assert shape_labels(mixed) == ["bf16", "fp16"]


def test_matplotlib_missing_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = fx.write(report_bundle(), tmp_path / "b.json")
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # what `import` sees when it is not installed
    res = runner.invoke(app, ["report", str(src), "-o", str(tmp_path / "r")])
    assert res.exit_code == 2
    assert "matplotlib is not installed" in res.stderr and "mamba-tune[report]" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_bad_inputs(tmp_path: Path) -> None:
    res = runner.invoke(app, ["report", str(tmp_path / "nope.json"), "-o", str(tmp_path / "r")])
    assert res.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    res = runner.invoke(app, ["report", str(bad), "-o", str(tmp_path / "r")])
    assert res.exit_code == 2 and "a bundle is a JSON object" in res.stderr


def test_search_traces_get_a_figure_and_their_time_to_within_one_percent(tmp_path: Path) -> None:
    """Entries with a search trace: a best-so-far figure for their kernel (none for a kernel
    without traces), and the table says when each search came within 1% of its best."""
    bundle = report_bundle()
    traced = {}
    for key, e in bundle.entries.items():
        if e.kernel == "gated_norm_fwd":
            trace = [(2.0, 0.30), (11.0, 0.1009), (40.0, 0.1)]  # within 1% of 0.1 at 11 s
            e = e.model_copy(update={"search": e.search.model_copy(update={"trace": trace})})
        traced[key] = e
    src = fx.write(bundle.model_copy(update={"entries": traced}), tmp_path / "h200" / "nano.json")
    out = tmp_path / "report"
    res = runner.invoke(app, ["report", str(src), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert {p.name for p in out.glob("*.png")} == {"speedup-gated_norm_fwd.png", "speedup-gated_norm_bwd.png",
                                                   "search-gated_norm_fwd.png"}
    data = (out / "search-gated_norm_fwd.png").read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 10_000
    md = (out / "report.md").read_text()
    assert "](search-gated_norm_fwd.png)" in md and "](search-gated_norm_bwd.png)" not in md
    assert md.count("60 s, within 1% at 11 s |") == 3
    assert fx.assert_md_tables(md) == 4


def test_provenance_lists_each_kernels_config_spaces_from_its_entries(tmp_path: Path) -> None:
    # Two fwd entries in one space, one in another (as a kernel's packed and unpacked calls);
    # the bwd kernel's entries carry none (a bundle from before the field): no space is named.
    b = report_bundle()
    spaces = iter(["a" * 64, "a" * 64, "b" * 64])
    entries = {k: e.model_copy(update={"search": e.search.model_copy(update={"config_spec_fingerprint": next(spaces)})})
               if e.kernel == "gated_norm_fwd" else e for k, e in sorted(b.entries.items())}
    src = fx.write(b.model_copy(update={"entries": entries}), tmp_path / "h200" / "nano.json")
    res = runner.invoke(app, ["report", str(src), "-o", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "report" / "report.md").read_text()
    fwd = next(line for line in md.splitlines() if line.startswith("| kernel gated_norm_fwd |"))
    assert fwd.endswith(f", config spaces {'a' * 12} (2 entries), {'b' * 12} (1 entry) |"), fwd
    bwd = next(line for line in md.splitlines() if line.startswith("| kernel gated_norm_bwd |"))
    assert "config spa" not in bwd, bwd


def test_a_kernel_name_that_is_a_path_writes_nothing_anywhere(tmp_path: Path) -> None:
    """Figures are named after kernels: a crafted bundle's kernel `../../escape` must not
    put a PNG outside -o (one line, exit 2, no file written)."""
    src = fx.write(report_bundle(), tmp_path / "src" / "h200" / "nano.json")
    src.write_text(src.read_text().replace("gated_norm_fwd", "../../escape"))
    out = tmp_path / "a" / "b" / "report"
    (out / "speedup-..").mkdir(parents=True)  # then speedup-../../escape.png is a/b/escape.png
    res = runner.invoke(app, ["report", str(src), "-o", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "'../../escape' is not a safe file name" in lines[0], res.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["src/h200/nano.json"], written
