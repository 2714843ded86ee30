"""`mamba-tune merge`: the faster entry wins on one SKU and one set of versions; mixing is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bundles import H200, VERSIONS, bundle, entry, norm_dims

from mamba_tune.bundle import Failure, GpuInfo, load_bundle, write_bundle

ROOT = Path(__file__).resolve().parent.parent


def merge(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "autotune_cli", "merge", *args], cwd=ROOT, capture_output=True,
                          text=True)


def test_merge_keeps_the_faster_entry_and_both_sides(tmp_path):
    shared_a = entry(dims=norm_dims(rows=1024), tuned_ms=0.30, config={"block_sizes": [4, 1]})
    shared_b = entry(dims=norm_dims(rows=1024), tuned_ms=0.20, config={"block_sizes": [16, 1]})
    only_a = entry(dims=norm_dims(rows=2048), tuned_ms=0.5)
    only_b = entry(dims=norm_dims(rows=4096), tuned_ms=0.7)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    fb = bundle(only_b, shared_b)
    failed = Failure(kernel="gated_norm_fwd", dims=norm_dims(rows=2048), dtype="bf16", reason="x", at="t")
    fb = fb.with_failure(failed, updated="t")  # a failure in B for a key A tuned: A's entry stays
    write_bundle(bundle(shared_a, only_a), a)
    write_bundle(fb, b)
    r = merge(str(a), str(b), "-o", str(tmp_path / "m.json"))
    assert r.returncode == 0, r.stderr
    m = load_bundle(tmp_path / "m.json")
    assert set(m.entries) == {shared_a.key, only_a.key, only_b.key}
    assert m.entries[shared_a.key].config == {"block_sizes": [16, 1]}
    assert m.entries[shared_a.key].timing.tuned_ms == 0.20
    assert m.failures == {}
    # Order does not matter.
    r = merge(str(b), str(a), "-o", str(tmp_path / "m2.json"))
    assert r.returncode == 0, r.stderr
    assert load_bundle(tmp_path / "m2.json").entries[shared_a.key].timing.tuned_ms == 0.20


def test_merge_refuses_other_versions_or_gpus_unless_allowed(tmp_path):
    a, b, c = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "c.json"
    write_bundle(bundle(entry(tuned_ms=0.3)), a)
    write_bundle(bundle(entry(tuned_ms=0.2), versions=VERSIONS.model_copy(update={"helion": "1.6.0"})), b)
    h100 = GpuInfo(name="NVIDIA H100", sku="h100", arch="sm90", compute_capability="9.0", sm_count=132)
    write_bundle(bundle(entry(tuned_ms=0.1), gpu=h100), c)
    for other, word in ((b, "helion 1.6.0"), (c, "NVIDIA H100")):
        r = merge(str(a), str(other), "-o", str(tmp_path / "m.json"))
        assert r.returncode == 2
        assert len(r.stderr.strip().splitlines()) == 1 and word in r.stderr and "--allow-mixed" in r.stderr
        assert not (tmp_path / "m.json").exists()
    r = merge(str(a), str(b), "-o", str(tmp_path / "m.json"), "--allow-mixed")
    assert r.returncode == 0, r.stderr
    m = load_bundle(tmp_path / "m.json")
    assert m.provenance.gpu == H200 and m.provenance.versions.helion == "1.5.0"


def test_merge_bad_bundle_is_one_line(tmp_path):
    a, bad = tmp_path / "a.json", tmp_path / "bad.json"
    write_bundle(bundle(entry()), a)
    bad.write_text("{not json")
    r = merge(str(a), str(bad), "-o", str(tmp_path / "m.json"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "bad.json" in r.stderr
