"""`mamba-tune merge`: the faster entry wins on one SKU and one set of versions; mixing is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from bundles import H200, VERSIONS, bundle, entry, norm_dims

from mamba_tune.bundle import Failure, GpuInfo, load_bundle, write_bundle

ROOT = Path(__file__).resolve().parents[2]


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


def test_merge_keeps_one_kernel_source_and_drops_entries_tuned_on_another(tmp_path):
    """A kernel re-tuned after its source changed: the merged bundle keeps the entries tuned with
    this checkout's source, whichever bundle comes first, and drops the older ones (even when
    faster), with a note; its record names this checkout's source. Before, the first bundle's
    record was kept: the old entries passed for fresh and the new ones read as stale."""
    from mamba_tune.keys import GATED_NORM_FWD

    current = GATED_NORM_FWD.source_sha256()
    old_same_key = entry(dims=norm_dims(rows=1024), tuned_ms=0.10)
    old_only = entry(dims=norm_dims(rows=2048), tuned_ms=0.10)
    new = entry(dims=norm_dims(rows=1024), tuned_ms=0.30)
    a, b = tmp_path / "old.json", tmp_path / "new.json"
    write_bundle(bundle(old_same_key, old_only, kernel_hashes={"gated_norm_fwd": "0" * 64}), a)
    write_bundle(bundle(new), b)
    for order in ((a, b), (b, a)):
        r = merge(*map(str, order), "-o", str(tmp_path / "m.json"))
        assert r.returncode == 0, r.stderr
        m = load_bundle(tmp_path / "m.json")
        assert set(m.entries) == {new.key}
        assert m.entries[new.key].timing.tuned_ms == 0.30
        assert m.provenance.kernels["gated_norm_fwd"].source_sha256 == current
        assert r.stdout.count("dropped") + r.stderr.count("dropped") == 2, r.stdout + r.stderr


HOLD = ("import sys, time\nfrom filelock import FileLock\n"
        "with FileLock(sys.argv[1] + '.lock'):\n    print('held', flush=True)\n    sys.stdin.read()\n")


def test_merge_into_a_bundle_a_sweep_is_writing_is_refused(tmp_path):
    """The bundle's lock (`<bundle>.lock`, the one a sweep holds for its whole run), held by a
    real second process: `merge -o` into it exits 2 and leaves the bundle as it was; once the
    holder is gone the merge goes through."""
    a, target = tmp_path / "a.json", tmp_path / "h200" / "nano.json"
    write_bundle(bundle(entry(dims=norm_dims(rows=2048))), a)
    write_bundle(bundle(entry(dims=norm_dims(rows=1024))), target)
    before = target.read_bytes()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(target)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        r = merge(str(a), str(target), "-o", str(target))
        assert r.returncode == 2, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and f"another sweep is writing {target}" in lines[0], r.stderr
        assert target.read_bytes() == before
    finally:
        holder.communicate("", timeout=60)
    r = merge(str(a), str(target), "-o", str(target))
    assert r.returncode == 0, r.stderr
    assert len(load_bundle(target).entries) == 2


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder this process cannot write: mode 0555, or for root (whom modes do not stop) a
    read-only bind mount; skipped where neither is possible."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    if subprocess.run(["mount", "--bind", "-o", "ro", str(src), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("root, and no read-only bind mount here")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_merge_onto_a_read_only_folder_is_one_line_exit_2(tmp_path, read_only_dir):
    a = tmp_path / "a.json"
    write_bundle(bundle(entry()), a)
    out = read_only_dir / "m.json"
    r = merge(str(a), "-o", str(out))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"cannot write {out}" in lines[0], r.stderr
    assert "Read-only file system" in lines[0] or "Permission denied" in lines[0], r.stderr
    assert list(read_only_dir.iterdir()) == []
