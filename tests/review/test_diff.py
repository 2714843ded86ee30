"""`mamba-tune diff`: every kind of change, folders, git revisions, regressions, formats."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import review_fixtures as fx
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.review.diff import diff_sets, regressions, to_markdown
from autotune_cli.review.sources import SourceError, load_source
from mamba_tune.bundle import entry_key

runner = CliRunner()

FWD = "gated_norm_fwd"
BWD = "gated_norm_bwd"


def key(kernel: str, rows: int) -> str:
    return entry_key(kernel, fx.norm_dims(rows), "bf16")


def old_bundle() -> fx.Bundle:
    return fx.bundle(
        [
            fx.entry(FWD, fx.norm_dims(16384), tuned=0.10),  # A: config changes
            fx.entry(FWD, fx.norm_dims(8192)),  # B: removed
            fx.entry(FWD, fx.norm_dims(4096)),  # C: unchanged
            fx.entry(BWD, fx.norm_dims(16384), tuned=0.10, default=0.15),  # D: 20% slower
            fx.entry(BWD, fx.norm_dims(8192), tuned=0.10, default=0.15),  # E: faster
            fx.entry(BWD, fx.norm_dims(4096), tuned=0.10, baseline=0.20),  # F: loses speedup vs baseline
        ],
        [fx.failure(FWD, fx.norm_dims(2048), reason="worker timed out [searching]"),  # H: fixed
         fx.failure(BWD, fx.norm_dims(1024), reason="worker timed out")],  # J: fails for another reason
    )


def new_bundle() -> fx.Bundle:
    return fx.bundle(
        [
            fx.entry(FWD, fx.norm_dims(16384), tuned=0.09,
                     cfg=fx.config(num_warps=8, block_sizes=[64, 1], pid_type="flat"), tuned_at="2026-12-01T00:00:00+00:00"),
            fx.entry(FWD, fx.norm_dims(4096)),
            fx.entry(BWD, fx.norm_dims(16384), tuned=0.12, default=0.15),
            fx.entry(BWD, fx.norm_dims(8192), tuned=0.08, default=0.15),
            fx.entry(BWD, fx.norm_dims(4096), tuned=0.10, baseline=0.15),
            fx.entry(FWD, fx.norm_dims(1024)),  # G: added
        ],
        [fx.failure(BWD, fx.norm_dims(2048), reason="numerics check failed against the fp32 reference"),  # I
         fx.failure(BWD, fx.norm_dims(1024), reason="autotune failed: NoConfigFound")],
        versions=fx.VERSIONS.model_copy(update={"triton": "3.7.0"}),
        kernels={FWD: fx.SHA_B, BWD: fx.SHA_A},
        updated="2026-12-01T00:00:00+00:00",
        git_sha="89abcdef",
    )


@pytest.fixture()
def pair(tmp_path: Path) -> tuple[Path, Path]:
    return fx.write(old_bundle(), tmp_path / "old" / "nano.json"), fx.write(new_bundle(), tmp_path / "new" / "nano.json")


def test_every_kind_of_change(pair: tuple[Path, Path]) -> None:
    d = diff_sets(load_source(str(pair[0])), load_source(str(pair[1])))
    (b,) = d.bundles
    kinds = {e.key: e.kind for e in b.entries}
    assert kinds == {
        key(FWD, 16384): "changed", key(FWD, 8192): "removed", key(FWD, 4096): "unchanged",
        key(BWD, 16384): "changed", key(BWD, 8192): "changed", key(BWD, 4096): "changed", key(FWD, 1024): "added",
    }
    by_key = {e.key: e for e in b.entries}
    a = by_key[key(FWD, 16384)]
    assert {c.field: (c.old, c.new) for c in a.config} == {
        "num_warps": (4, 8), "block_sizes": ([32, 1], [64, 1]), "pid_type": (None, "flat")}
    assert "config" in a.parts and "timing" in a.parts
    assert by_key[key(BWD, 16384)].tuned_ms_pct == pytest.approx(20.0)
    assert by_key[key(BWD, 16384)].config == ()
    assert by_key[key(BWD, 8192)].tuned_ms_pct == pytest.approx(-20.0)
    f = by_key[key(BWD, 4096)]
    assert f.parts == ("timing", "speedup")
    assert f.vs_baseline_delta == pytest.approx(-0.5)
    assert f.vs_baseline_loss_pct == pytest.approx(25.0)
    assert {(x.key, x.kind) for x in b.failures} == {
        (key(FWD, 2048), "removed"), (key(BWD, 2048), "added"), (key(BWD, 1024), "changed")}
    prov = {c.field: (c.old, c.new) for c in b.provenance}
    assert prov == {"versions.triton": ("3.6.0", "3.7.0"), f"kernels.{FWD}.source_sha256": (fx.SHA_A, fx.SHA_B)}
    s = d.summary()
    assert (s["entries_added"], s["entries_removed"], s["entries_changed"], s["entries_unchanged"]) == (1, 1, 4, 1)
    assert (s["configs_changed"], s["faster"], s["slower"]) == (1, 2, 1)
    assert (s["failures_added"], s["failures_removed"], s["failures_changed"]) == (1, 1, 1)


def test_tuned_at_alone_is_no_change(tmp_path: Path) -> None:
    a = fx.write(fx.bundle([fx.entry()]), tmp_path / "a.json")
    b = fx.write(fx.bundle([fx.entry(tuned_at="2027-01-01T00:00:00+00:00")], updated="2027-01-01T00:00:00+00:00",
                           git_sha="ffff"), tmp_path / "b.json")
    d = diff_sets(load_source(str(a)), load_source(str(b)))
    assert not d.has_changes
    res = runner.invoke(app, ["diff", str(a), str(b), "--format", "markdown"])
    assert res.exit_code == 0
    assert "no changes (1 entries in 1 bundle(s) compared)" in res.stdout


def test_regressions_thresholds(pair: tuple[Path, Path]) -> None:
    d = diff_sets(load_source(str(pair[0])), load_source(str(pair[1])))
    # 20% slower also costs D 1/6 of its speedup vs the baseline (2.0x -> 1.67x).
    assert {(r.key, r.metric) for r in regressions(d, 10)} == {
        (key(BWD, 16384), "tuned_ms"), (key(BWD, 16384), "vs_baseline"), (key(BWD, 4096), "vs_baseline")}
    assert {(r.key, r.metric) for r in regressions(d, 18)} == {
        (key(BWD, 16384), "tuned_ms"), (key(BWD, 4096), "vs_baseline")}
    assert {(r.key, r.metric) for r in regressions(d, 22)} == {(key(BWD, 4096), "vs_baseline")}
    assert regressions(d, 30) == []


@pytest.mark.parametrize(("pct", "code", "flagged"), [
    ("10", 1, {key(BWD, 16384), key(BWD, 4096)}),
    ("22", 1, {key(BWD, 4096)}),
    ("30", 0, set()),
], ids=["both", "baseline-only", "none"])
def test_fail_on_regression_exit_codes(pair: tuple[Path, Path], pct: str, code: int, flagged: set[str]) -> None:
    res = runner.invoke(app, ["diff", str(pair[0]), str(pair[1]), "--format", "json", "--fail-on-regression", pct])
    assert res.exit_code == code, res.output
    data = json.loads(res.stdout)
    assert {r["key"] for r in data["regressions"]} == flagged
    assert data["regression_threshold_pct"] == float(pct)
    for k in flagged:
        assert k in res.stderr


def test_json_output(pair: tuple[Path, Path]) -> None:
    res = runner.invoke(app, ["diff", str(pair[0]), str(pair[1]), "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["regressions"] is None
    (b,) = data["bundles"]
    entries = {e["key"]: e for e in b["entries"]}
    assert key(FWD, 4096) not in entries  # unchanged entries are counted, not listed
    assert entries[key(FWD, 1024)]["kind"] == "added" and entries[key(FWD, 1024)]["old"] is None
    assert entries[key(BWD, 16384)]["old"]["tuned_ms"] == 0.10 and entries[key(BWD, 16384)]["new"]["tuned_ms"] == 0.12
    assert {c["field"] for c in entries[key(FWD, 16384)]["config"]} == {"num_warps", "block_sizes", "pid_type"}
    assert {f["field"] for f in b["provenance"]} == {"versions.triton", f"kernels.{FWD}.source_sha256"}
    assert data["summary"]["entries_unchanged"] == 1
    fails = {f["key"]: f for f in b["failures"]}
    assert (fails[key(BWD, 1024)]["old_reason"], fails[key(BWD, 1024)]["new_reason"]) == (
        "worker timed out", "autotune failed: NoConfigFound")


def test_markdown_output(pair: tuple[Path, Path]) -> None:
    res = runner.invoke(app, ["diff", str(pair[0]), str(pair[1]), "--format", "markdown",
                              "--fail-on-regression", "10"])
    assert res.exit_code == 1
    md = res.stdout
    first = md.splitlines()[0]
    assert first.startswith("**mamba-tune diff**")
    assert "entries +1 -1 ~4" in first and "1 config(s) changed; 2 faster, 1 slower" in first
    assert "failures +1 -1 ~1" in first and "3 regression(s) over 10%" in first
    for section in ("### Regressions (over 10%)", "### `nano.json`", "**Provenance**", "**Added** (1)",
                    "**Removed** (1)", "**Changed** (4)", "**Failures** (3)"):
        assert section in md, section
    assert "`num_warps: 4 -> 8`" in md
    assert "`block_sizes: [32,1] -> [64,1]`" in md
    assert "0.1000 -> 0.1200 (+20.0%)" in md
    assert "2.00x -> 1.50x (-0.50)" in md
    assert "| versions.triton | `3.6.0` | `3.7.0` |" in md
    assert f"`{fx.SHA_A[:12]}` | `{fx.SHA_B[:12]}`" in md
    assert "new failure" in md and "fixed" in md
    assert "| reason changed | autotune failed: NoConfigFound |" in md
    assert "updated" not in md and "git_sha" not in md
    assert fx.assert_md_tables(md) == 6  # regressions, provenance, added, removed, changed, failures
    assert to_markdown(diff_sets(load_source(str(pair[0])), load_source(str(pair[0])))).count("###") == 0


def test_table_output(pair: tuple[Path, Path]) -> None:
    res = runner.invoke(app, ["diff", str(pair[0]), str(pair[1])])
    assert res.exit_code == 0, res.output
    assert "entries +1 -1 ~4" in res.stdout
    assert "num_warps: 4 -> 8" in res.stdout
    assert "versions.triton" in res.stdout
    assert "worker timed out [searching]" in res.stdout  # plain text, not rich markup


def test_folder_vs_folder(tmp_path: Path) -> None:
    fx.write(fx.bundle([fx.entry(tuned=0.1)]), tmp_path / "old/h200/a.json")
    fx.write(fx.bundle([fx.entry()]), tmp_path / "old/h200/b.json")
    fx.write(fx.bundle([fx.entry(tuned=0.2)]), tmp_path / "new/h200/a.json")
    fx.write(fx.bundle([fx.entry()]), tmp_path / "new/h100/c.json")
    d = diff_sets(load_source(str(tmp_path / "old")), load_source(str(tmp_path / "new")))
    assert {b.path: b.status for b in d.bundles} == {"h200/a.json": "both", "h200/b.json": "removed",
                                                     "h100/c.json": "added"}
    both = next(b for b in d.bundles if b.path == "h200/a.json")
    assert [e.kind for e in both.entries] == ["changed"]
    res = runner.invoke(app, ["diff", str(tmp_path / "old"), str(tmp_path / "new"), "--format", "markdown"])
    assert res.exit_code == 0
    assert "### `h100/c.json` (new bundle)" in res.stdout and "### `h200/b.json` (bundle removed)" in res.stdout
    res = runner.invoke(app, ["diff", str(tmp_path / "old"), str(tmp_path / "new/h200/a.json")])
    assert res.exit_code == 2
    assert "cannot compare a bundle file with a folder" in res.stderr


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _git(tmp_path, "init", "-q", "-b", "main")
    fx.write(old_bundle(), tmp_path / "configs/h200/nano.json")
    _git(tmp_path, "add", "configs")
    _git(tmp_path, "commit", "-q", "-m", "bundle")
    fx.write(new_bundle(), tmp_path / "configs/h200/nano.json")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_git_revision_file_and_folder(repo: Path) -> None:
    res = runner.invoke(app, ["diff", "HEAD:configs/h200/nano.json", "configs/h200/nano.json", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["old"] == "HEAD:configs/h200/nano.json"
    assert data["summary"]["entries_added"] == 1 and data["summary"]["entries_changed"] == 4
    res = runner.invoke(app, ["diff", "main:configs/h200", "configs/h200", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [b["path"] for b in json.loads(res.stdout)["bundles"]] == ["nano.json"]
    # Same revision on both sides: nothing changed.
    res = runner.invoke(app, ["diff", "HEAD:configs", "main:configs", "--format", "json"])
    assert json.loads(res.stdout)["summary"]["entries_unchanged"] == 6


@pytest.mark.parametrize(("old", "message"), [
    ("nope:configs/h200", "unknown git revision 'nope'"),
    ("HEAD:configs/b200", "path 'configs/b200' does not exist in revision 'HEAD'"),
    ("configs/h100/x.json", "no such file or directory"),
], ids=["bad-revision", "path-not-in-revision", "missing-file"])
def test_bad_sources_are_one_line_errors(repo: Path, old: str, message: str) -> None:
    res = runner.invoke(app, ["diff", old, "configs/h200"])
    assert res.exit_code == 2
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert res.stdout == ""


def test_missing_ok_for_a_new_sku(repo: Path) -> None:
    res = runner.invoke(app, ["diff", "HEAD:configs/b200", "configs/h200", "--missing-ok", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["summary"]["bundles_added"] == 1 and data["summary"]["entries_added"] == 6
    # --missing-ok does not hide an unknown revision.
    res = runner.invoke(app, ["diff", "nope:configs/b200", "configs/h200", "--missing-ok"])
    assert res.exit_code == 2 and "unknown git revision" in res.stderr


def test_not_a_git_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    with pytest.raises(SourceError, match="not in a git repository"):
        load_source("main:generated_configs")


def test_invalid_bundle_inputs(tmp_path: Path) -> None:
    good = fx.write(fx.bundle([fx.entry()]), tmp_path / "good.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 1, "entries": ')
    res = runner.invoke(app, ["diff", str(bad), str(good)])
    assert res.exit_code == 2
    assert "not valid JSON" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"schema_version": 1, "provenance": {}}))
    res = runner.invoke(app, ["diff", str(good), str(wrong)])
    assert res.exit_code == 2 and "wrong.json: provenance" in res.stderr
    res = runner.invoke(app, ["diff", str(good), str(good), "--format", "html"])
    assert res.exit_code == 2
    assert "html" in res.output
    res = runner.invoke(app, ["diff", str(good), str(good), "--fail-on-regression", "-5"])
    assert res.exit_code == 2


def test_table_prints_markup_in_paths_as_text(tmp_path: Path) -> None:
    name = "h200/[bold]a[x].json"  # bundles sit at <root>/<sku>/<name>.json: no "/" in the name
    fx.write(fx.bundle([fx.entry(tuned=0.1)]), tmp_path / "old" / name)
    fx.write(fx.bundle([fx.entry(tuned=0.2)], versions=fx.VERSIONS.model_copy(update={"triton": "9.9.9"})),
             tmp_path / "new" / name)
    res = runner.invoke(app, ["diff", str(tmp_path / "old"), str(tmp_path / "new")])
    assert res.exit_code == 0, res.output
    assert f"{name}: entries" in res.stdout and f"{name}: provenance" in res.stdout


def test_non_finite_numbers_are_bad_input_not_invalid_json_output(tmp_path: Path) -> None:
    good = fx.write(fx.bundle([fx.entry()]), tmp_path / "good.json")
    data = json.loads(good.read_text())
    next(iter(data["entries"].values()))["speedup"]["vs_default"] = float("nan")
    nan = tmp_path / "nan.json"
    nan.write_text(json.dumps(data))  # Python writes NaN, which is not JSON
    res = runner.invoke(app, ["diff", str(good), str(nan), "--format", "json"])
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [f"error: {nan}: not valid JSON: NaN is not a JSON number"]
    assert res.stdout == ""
    res = runner.invoke(app, ["show", str(nan)])  # never a "nanx" speedup
    assert res.exit_code == 2 and "nanx" not in res.output


def test_times_on_different_cards_are_not_compared(tmp_path: Path) -> None:
    """A new SKU's bundles against a sibling's (h200 -> h100): the configs are compared, the
    times were taken on two cards, so no entry is faster, slower or a regression."""
    old = fx.write(fx.bundle([fx.entry(BWD, fx.norm_dims(16384), tuned=0.10, baseline=0.30),
                              fx.entry(FWD, fx.norm_dims(16384), tuned=0.10)]), tmp_path / "h200" / "n.json")
    new = fx.write(fx.bundle([fx.entry(BWD, fx.norm_dims(16384), tuned=0.20, baseline=0.30),
                              fx.entry(FWD, fx.norm_dims(16384), tuned=0.10,
                                       cfg=fx.config(num_warps=8, block_sizes=[64, 1], pid_type="flat"))],
                             gpu=fx.H100), tmp_path / "h100" / "n.json")
    d = diff_sets(load_source(str(old)), load_source(str(new)))
    assert regressions(d, 1) == []
    s = d.summary()
    assert (s["faster"], s["slower"], s["other_card"], s["configs_changed"]) == (0, 0, 2, 1)
    md = to_markdown(d)
    assert "(1 config(s) changed)" in md.splitlines()[0]
    assert "2 entries timed on different cards (h200 -> h100)" in md.splitlines()[0]
    assert "0.1000 (h200) -> 0.2000 (h100)" in md
    res = runner.invoke(app, ["diff", str(old), str(new), "--format", "json", "--fail-on-regression", "1"])
    assert res.exit_code == 0, res.output
    assert {tuple(e["cards"]) for e in json.loads(res.stdout)["bundles"][0]["entries"]} == {("h200", "h100")}
    # The same entries timed on one card are compared: the 2x slower one is a regression.
    same = fx.write(fx.bundle([fx.entry(BWD, fx.norm_dims(16384), tuned=0.20, baseline=0.30)]), tmp_path / "same.json")
    assert {(r.key, r.metric) for r in regressions(diff_sets(load_source(str(old)), load_source(str(same))), 1)} == {
        (key(BWD, 16384), "tuned_ms"), (key(BWD, 16384), "vs_baseline")}


def test_the_sku_diff_document_is_current() -> None:
    """docs/sku-diff-h200-h100.md ends with what its command prints for the committed bundles."""
    root = Path(__file__).resolve().parents[2]
    doc = (root / "docs" / "sku-diff-h200-h100.md").read_text()
    command = "mamba-tune diff generated_configs/h200 generated_configs/h100 --format markdown"
    assert f"```bash\n{command}\n```\n\n" in doc
    res = runner.invoke(app, ["diff", str(root / "generated_configs/h200"), str(root / "generated_configs/h100"),
                              "--format", "markdown"])
    assert res.exit_code == 0, res.output
    printed = res.stdout.replace(str(root) + "/", "")
    assert doc.split(f"```bash\n{command}\n```\n\n", 1)[1] == printed, (
        f"docs/sku-diff-h200-h100.md is stale: regenerate it with `{command}`")


def test_an_adopted_entry_is_marked_in_every_format(tmp_path: Path) -> None:
    # An H100 entry that took the H200's config with no search (`sweep --adopt-sibling`) says so
    # next to its key; a searched one does not.
    def adopted(e: fx.Entry) -> fx.Entry:
        return e.model_copy(update={"search": e.search.model_copy(update={"adopted_from": "h200"})})

    old = fx.write(fx.bundle([fx.entry(FWD, fx.norm_dims(16384), tuned=0.10)], gpu=fx.H100), tmp_path / "a.json")
    new = fx.write(fx.bundle([adopted(fx.entry(FWD, fx.norm_dims(16384), tuned=0.09)),
                              adopted(fx.entry(FWD, fx.norm_dims(8192))), fx.entry(BWD, fx.norm_dims(8192))],
                             gpu=fx.H100), tmp_path / "b.json")
    md = runner.invoke(app, ["diff", str(old), str(new), "--format", "markdown"]).stdout
    for k in (key(FWD, 16384), key(FWD, 8192)):
        assert f"`{k}`<br>adopted from h200 (no search) |".replace("|bf16", "\\|bf16").replace("|d=", "\\|d=") in md
    assert md.count("adopted from") == 2, md
    data = json.loads(runner.invoke(app, ["diff", str(old), str(new), "--format", "json"]).stdout)
    news = {e["key"]: e["new"]["adopted_from"] for e in data["bundles"][0]["entries"]}
    assert news == {key(FWD, 16384): "h200", key(FWD, 8192): "h200", key(BWD, 8192): None}
    res = runner.invoke(app, ["diff", str(old), str(new)], env={"COLUMNS": "300"})
    assert res.stdout.count("adopted from h200 (no search)") == 2, res.stdout
