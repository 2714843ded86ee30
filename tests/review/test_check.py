"""`mamba-tune check`: the coverage gate (complete, missing, stale by hash, version or GPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import review_fixtures as fx
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.plan import Combo, plan
from autotune_cli.review.check import check_coverage, version_matches
from autotune_cli.spec import load_spec
from autotune_cli.tuning import all_kernels
from mamba_tune.bundle import Entry

runner = CliRunner()
TINY = Path(__file__).resolve().parent.parent / "data" / "tiny.yaml"


@pytest.fixture(scope="module")
def combos() -> list[Combo]:
    return plan(load_spec(TINY))


@pytest.fixture(scope="module")
def hashes() -> dict[str, str]:
    return {name: tk.source_sha256() for name, tk in all_kernels().items() if name.startswith("gated_norm")}


def entries_for(combos: list[Combo]) -> list[Entry]:
    return [fx.entry(c.kernel, c.dims, dtype=c.dtype) for c in combos]


def run_check(root: Path, *extra: str) -> tuple[int, dict]:
    res = runner.invoke(app, ["check", str(TINY), "--bundles", str(root), "--format", "json", *extra])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def statuses(data: dict) -> dict[str, str]:
    return {c["key"]: c["status"] for c in data["combos"]}


def test_complete(tmp_path: Path, combos: list[Combo], hashes: dict[str, str]) -> None:
    assert len(combos) == 8  # tiny.yaml: 2 kernels x 2 tp x 2 seqlen
    fx.write(fx.bundle(entries_for(combos), kernels=hashes), tmp_path / "h200" / "tiny.json")
    code, data = run_check(tmp_path)
    assert code == 0
    assert data["ok"] is True and data["counts"] == {"ok": 8, "missing": 0, "stale": 0, "sibling": 0}
    assert set(statuses(data)) == {c.key for c in combos}
    assert data["expected_versions"] == {"helion": "1.5.0", "torch": "2.11.0+cu130", "triton": "3.6.0"}
    assert data["expected_sources"]["helion"].startswith("newest bundle ")
    res = runner.invoke(app, ["check", str(TINY), "--bundles", str(tmp_path)])
    assert res.exit_code == 0 and "8/8 combos covered" in res.stdout


def test_split_over_bundles_is_complete(tmp_path: Path, combos: list[Combo], hashes: dict[str, str]) -> None:
    fx.write(fx.bundle(entries_for(combos[:5]), kernels=hashes), tmp_path / "h200" / "a.json")
    fx.write(fx.bundle(entries_for(combos[5:]), kernels=hashes), tmp_path / "h200" / "sub" / "b.json")
    # A bundle for another SKU is not looked at.
    fx.write(fx.bundle([], gpu=fx.H100, kernels=hashes), tmp_path / "h100" / "x.json")
    code, data = run_check(tmp_path)
    assert code == 0 and len(data["bundles"]) == 2


def test_missing(tmp_path: Path, combos: list[Combo], hashes: dict[str, str]) -> None:
    failed = combos[1]
    fx.write(fx.bundle(entries_for(combos[2:]), [fx.failure(failed.kernel, failed.dims, reason="worker timed out")],
                       kernels=hashes), tmp_path / "h200" / "tiny.json")
    code, data = run_check(tmp_path)
    assert code == 1
    st = statuses(data)
    assert st[combos[0].key] == "missing" and st[combos[1].key] == "missing"
    assert [k for k, v in st.items() if v != "ok"] == [combos[0].key, combos[1].key]
    reasons = {c["key"]: c["reasons"] for c in data["combos"]}
    assert "no entry in any bundle" in reasons[combos[0].key][0]
    assert "tuning failed: worker timed out" in reasons[combos[1].key][0]
    res = runner.invoke(app, ["check", str(TINY), "--bundles", str(tmp_path), "--format", "markdown"])
    assert res.exit_code == 1
    assert "6/8 combos covered" in res.stdout and "2 missing, 0 stale" in res.stdout
    assert "| missing | `{}` |".format(combos[0].key.replace("|", "\\|")) in res.stdout
    assert fx.assert_md_tables(res.stdout) == 1


def test_no_bundles_for_the_sku(tmp_path: Path) -> None:
    code, data = run_check(tmp_path)
    assert code == 1 and data["counts"]["missing"] == 8
    assert data["expected_versions"] == {"helion": None, "torch": None, "triton": None}


def test_stale_kernel_hash(tmp_path: Path, combos: list[Combo], hashes: dict[str, str]) -> None:
    fx.write(fx.bundle(entries_for(combos), kernels={**hashes, "gated_norm_bwd": fx.SHA_B}),
             tmp_path / "h200" / "tiny.json")
    code, data = run_check(tmp_path)
    assert code == 1
    for c in data["combos"]:
        if c["key"].startswith("gated_norm_bwd|"):
            assert c["status"] == "stale"
            assert "kernel gated_norm_bwd changed since tuning" in c["reasons"][0]
            assert fx.SHA_B[:12] in c["reasons"][0]
        else:
            assert c["status"] == "ok"
    # A kernel with no recorded hash is stale too.
    fx.write(fx.bundle(entries_for(combos), kernels={"gated_norm_fwd": hashes["gated_norm_fwd"]}),
             tmp_path / "h200" / "tiny.json")
    _, data = run_check(tmp_path)
    assert {c["status"] for c in data["combos"] if c["key"].startswith("gated_norm_bwd|")} == {"stale"}
    assert "no source hash recorded" in next(c for c in data["combos"] if c["status"] == "stale")["reasons"][0]


def test_stale_versions(tmp_path: Path, combos: list[Combo], hashes: dict[str, str]) -> None:
    fwd = [c for c in combos if c.kernel == "gated_norm_fwd"]
    bwd = [c for c in combos if c.kernel == "gated_norm_bwd"]
    old = fx.VERSIONS.model_copy(update={"helion": "1.4.0"})
    fx.write(fx.bundle(entries_for(fwd), kernels=hashes, updated="2026-12-02T00:00:00+00:00"),
             tmp_path / "h200" / "new.json")
    fx.write(fx.bundle(entries_for(bwd), kernels=hashes, versions=old, updated="2026-11-01T00:00:00+00:00"),
             tmp_path / "h200" / "old.json")
    # Default: the newest bundle's versions are expected; the older bundle is stale.
    code, data = run_check(tmp_path)
    assert code == 1
    st = statuses(data)
    assert {st[c.key] for c in fwd} == {"ok"} and {st[c.key] for c in bwd} == {"stale"}
    why = next(c["reasons"][0] for c in data["combos"] if c["status"] == "stale")
    assert "helion 1.4.0 != expected 1.5.0 (newest bundle" in why and "new.json" in why
    # An explicit option wins over the newest bundle.
    code, data = run_check(tmp_path, "--helion-version", "1.4.0")
    st = statuses(data)
    assert code == 1 and {st[c.key] for c in fwd} == {"stale"} and {st[c.key] for c in bwd} == {"ok"}
    assert data["expected_sources"]["helion"] == "option"
    # torch without a local label matches the recorded '+cu130' build; another label does not.
    fx.write(fx.bundle(entries_for(bwd), kernels=hashes, updated="2026-11-01T00:00:00+00:00"),
             tmp_path / "h200" / "old.json")
    assert run_check(tmp_path, "--torch-version", "2.11.0")[0] == 0
    code, data = run_check(tmp_path, "--torch-version", "2.11.0+cu128")
    assert code == 1 and data["counts"]["stale"] == 8


def test_version_rule() -> None:
    assert version_matches("2.11.0+cu130", "2.11.0+cu130")
    assert version_matches("2.11.0+cu130", "2.11.0")
    assert not version_matches("2.11.0", "2.11.0+cu130")
    assert not version_matches("2.11.1", "2.11.0")
    assert not version_matches("1.5.0", "1.5")


def test_stale_gpu(tmp_path: Path, combos: list[Combo], hashes: dict[str, str]) -> None:
    fx.write(fx.bundle(entries_for(combos), gpu=fx.H100, kernels=hashes), tmp_path / "h200" / "tiny.json")
    result = check_coverage(load_spec(TINY), tmp_path)
    assert not result.ok
    assert all(c.status == "stale" and "tuned on NVIDIA H100 80GB HBM3 (h100, sm90), not h200 (sm90)" in c.reasons[0]
               for c in result.combos)


def test_bad_inputs(tmp_path: Path) -> None:
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "broken.json").write_text("{")
    res = runner.invoke(app, ["check", str(TINY), "--bundles", str(tmp_path)])
    assert res.exit_code == 2 and "broken.json:1:2: not valid JSON: expecting property name" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    spec = tmp_path / "bad.yaml"
    spec.write_text("target: {gpu: h999}\n")
    res = runner.invoke(app, ["check", str(spec), "--bundles", str(tmp_path)])
    assert res.exit_code == 2 and "unknown GPU 'h999'" in res.stderr
    res = runner.invoke(app, ["check", str(TINY), "--bundles", str(tmp_path / "nowhere")])
    assert res.exit_code == 2
    res = runner.invoke(app, ["check", str(TINY), "--bundles", str(tmp_path), "--format", "xml"])
    assert res.exit_code == 2


def test_entry_with_a_config_helion_rejects_is_stale(tmp_path: Path, combos: list[Combo],
                                                     hashes: dict[str, str]) -> None:
    entries = entries_for(combos)
    bad = next(e for e in entries if e.kernel == "gated_norm_fwd")
    entries = [e.model_copy(update={"config": {**e.config, "block_sizes": [8, 1, 1]}}) if e is bad else e for e in entries]
    fx.write(fx.bundle(entries, kernels=hashes), tmp_path / "h200" / "tiny.json")
    code, data = run_check(tmp_path)
    assert code == 1
    assert data["counts"] == {"ok": 7, "missing": 0, "stale": 1, "sibling": 0}
    (stale,) = [c for c in data["combos"] if c["status"] == "stale"]
    assert stale["key"] == bad.key
    assert "Helion rejects its config: InvalidConfig: Too many values for config['block_sizes']" in stale["reasons"][0]


def test_sibling_sku_entries_are_not_coverage(tmp_path: Path, combos: list[Combo], hashes: dict[str, str]) -> None:
    """An h100 spec whose keys only the h200 bundles hold: the runtime would run those on an
    H100, but they were not tuned for it: not covered (exit 1), and the reasons name them."""
    spec = tmp_path / "tiny-h100.yaml"
    spec.write_text(TINY.read_text().replace("target: {gpu: h200, arch: sm90}", "target: {gpu: h100, arch: sm90}"))
    fx.write(fx.bundle(entries_for(combos), kernels=hashes), tmp_path / "h200" / "tiny.json")
    # The first combo tuned for the h100 too; the second's h200 entry tuned an older kernel source.
    fx.write(fx.bundle(entries_for(combos[:1]), gpu=fx.H100, kernels=hashes), tmp_path / "h100" / "tiny.json")
    fx.write(fx.bundle(entries_for(combos[1:2]), kernels={k: fx.SHA_B for k in hashes}), tmp_path / "h200" / "a.json")
    res = runner.invoke(app, ["check", str(spec), "--bundles", str(tmp_path), "--format", "json"])
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)
    assert data["counts"] == {"ok": 1, "missing": 0, "stale": 0, "sibling": 7}
    assert data["bundles"] == [(tmp_path / "h100" / "tiny.json").as_posix()]
    st = statuses(data)
    assert st[combos[0].key] == "ok" and {st[c.key] for c in combos[1:]} == {"sibling"}
    why = next(c["reasons"] for c in data["combos"] if c["key"] == combos[1].key)
    assert why == [f"not tuned for h100: {(tmp_path / 'h200' / 'tiny.json').as_posix()} has its entry, tuned on h200 "
                   "(what the runtime falls back to where no h100 entry is near enough)"]
    res = runner.invoke(app, ["check", str(spec), "--bundles", str(tmp_path)])
    assert res.exit_code == 1
    assert "7 served by a sibling SKU's entries (not tuned for h100)" in " ".join(res.stdout.split())
    # Without the h200's fresh bundle they are missing (the stale a.json is no fallback); the
    # h200 spec sees the h100 entry as a sibling's, and a.json's as stale.
    (tmp_path / "h200" / "tiny.json").unlink()
    _, data = run_check(tmp_path)
    assert data["counts"] == {"ok": 0, "missing": 6, "stale": 1, "sibling": 1}
    assert statuses(data)[combos[0].key] == "sibling"
    res = runner.invoke(app, ["check", str(spec), "--bundles", str(tmp_path), "--format", "json"])
    assert json.loads(res.stdout)["counts"] == {"ok": 1, "missing": 7, "stale": 0, "sibling": 0}
