"""Recording what runs (mamba_tune.record) and tuning it (`mamba-tune sweep --from-record`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bundles import bundle, entry, norm_dims
from typer.testing import CliRunner

import mamba_tune
from autotune_cli.app import app
from autotune_cli.from_record import combos_from_record
from mamba_tune import record, runtime
from mamba_tune.bundle import entry_key, load_bundle, write_bundle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bundles_at(tmp_path):
    """Point the runtime at a folder holding these bundles (none: no entries at all)."""
    count = iter(range(100))

    def use(*bundles: object) -> Path:
        root = tmp_path / f"bundles{next(count)}"
        root.mkdir()
        for i, b in enumerate(bundles):
            write_bundle(b, root / "h200" / f"b{i}.json")  # type: ignore[arg-type]
        runtime.configure(bundle_paths=[root])
        return root

    yield use
    runtime.configure()


def _norm(rows: int) -> torch.Tensor:
    """A real gated RMSNorm forward (Helion ref mode on CPU): d 64, groups of 32, z after the norm."""
    x = torch.randn(rows, 64, dtype=torch.bfloat16)
    return mamba_tune.rmsnorm_fn(x, torch.ones(64), None, z=torch.randn_like(x), group_size=32)


def _dims(rows: int) -> dict[str, int]:
    return norm_dims(rows=rows, d=64, group_size=32, norm_before_gate=1)


def _key(rows: int, kernel: str = "gated_norm_fwd") -> str:
    return entry_key(kernel, _dims(rows), "bf16")


def _call(rows: int, calls: int, served: dict[str, int], kernel: str = "gated_norm_fwd") -> dict[str, object]:
    return {"kernel": kernel, "dims": _dims(rows), "dtype": "bf16", "calls": calls, "served": served}


def test_record_calls_writes_keys_counts_and_how_served(tmp_path, bundles_at):
    bundles_at(bundle(entry(dims=_dims(32))))
    path = tmp_path / "rec.json"
    assert runtime.recorder() is None  # off unless asked for
    with torch.no_grad(), mamba_tune.record_calls(path):
        for rows, n in ((32, 3), (64, 2), (1024, 1)):
            for _ in range(n):
                _norm(rows)
    assert runtime.recorder() is None
    assert json.loads(path.read_text()) == {
        "format": "mamba-tune-record", "version": 1, "devices": ["cpu"],
        "calls": {
            _key(32): _call(32, 3, {"exact": 3}),
            _key(64): _call(64, 2, {f"nearest {_key(32)}": 2}),  # within 4x of rows 32
            _key(1024): _call(1024, 1, {"default": 1}),  # 32x: no entry is near enough
        },
    }


def test_records_merge_and_follow_configure(tmp_path, bundles_at):
    path = tmp_path / "rec.json"
    bundles_at()
    with torch.no_grad():
        with mamba_tune.record_calls(path):
            _norm(32)
        with mamba_tune.record_calls(path):
            _norm(32)
            bundles_at(bundle(entry(dims=_dims(32))))  # configure() mid-recording: resolved again
            _norm(32)
            _norm(32)
    calls = json.loads(path.read_text())["calls"]
    assert calls == {_key(32): _call(32, 4, {"default": 2, "exact": 2})}


def test_one_recorder_at_a_time(tmp_path):
    with mamba_tune.record_calls(tmp_path / "a.json"):
        with pytest.raises(RuntimeError, match="already recording kernel calls to .*a.json"):
            with mamba_tune.record_calls(tmp_path / "b.json"):
                pass
    assert not (tmp_path / "a.json").exists()  # nothing called, nothing written


def test_env_var_records_each_process_into_one_file(tmp_path):
    """Three processes at once (like ranks) write one record at exit, under its lock."""
    path = tmp_path / "rec.json"
    (tmp_path / "no-bundles").mkdir()
    env = {**os.environ, "HELION_INTERPRET": "1", "MAMBA_TUNE_RECORD": str(path),
           "MAMBA_TUNE_CONFIGS": str(tmp_path / "no-bundles")}
    code = ("import sys, torch, mamba_tune\nx = torch.randn(32, 64, dtype=torch.bfloat16)\n"
            "with torch.no_grad():\n    for _ in range(int(sys.argv[1])):\n"
            "        mamba_tune.rmsnorm_fn(x, torch.ones(64), None, z=x, group_size=32)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(n)], env=env, cwd=ROOT, stderr=subprocess.PIPE,
                              text=True) for n in (1, 2, 3)]
    for p in procs:
        _, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-2000:]
    doc = record.load_record(path)
    assert doc["calls"] == {_key(32): _call(32, 6, {"default": 6})}


@pytest.mark.parametrize("text,needle", [
    ("{", ":1:2: not valid JSON: expecting property name enclosed in double quotes (the file ends before it"),
    ("[]", "a record is a JSON object, got list"),
    ('{"format": "x"}', "not a mamba-tune-record file"),
    ('{"format": "mamba-tune-record", "version": 2}', "record version 2; this tool reads version 1"),
    ('{"format": "mamba-tune-record", "version": 1, "devices": "cpu", "calls": {}}', "'devices' must be a list"),
    (json.dumps({**record.empty_record(), "calls": {"k|rows=1|bf16": _call(32, 1, {"default": 1})}}),
     "key does not match kernel, dims and dtype"),
    (json.dumps({**record.empty_record(), "calls": {_key(32): _call(32, 2, {"default": 1})}}),
     "served counts do not add up to calls 2"),
    (json.dumps({**record.empty_record(), "calls": {_key(32): _call(32, -1, {"default": -1})}}),
     "expected a count >= 0, got -1"),
])
def test_bad_record_is_one_line_and_is_not_overwritten(tmp_path, text, needle):
    path = tmp_path / "rec.json"
    path.write_text(text)
    with pytest.raises(record.RecordError) as e:
        record.load_record(path)
    assert needle in str(e.value) and str(e.value).startswith(str(path)) and "\n" not in str(e.value)
    new = {**record.empty_record(), "devices": ["cpu"], "calls": {_key(32): _call(32, 1, {"default": 1})}}
    with pytest.raises(record.RecordError):
        record.merge_into(path, new)
    assert path.read_text() == text


# --- mamba-tune sweep --from-record ---------------------------------------------------------


def _write(path: Path, calls: dict[str, object], devices: tuple[str, ...] = ("NVIDIA H200",)) -> Path:
    path.write_text(json.dumps({**record.empty_record(), "devices": list(devices), "calls": calls}))
    return path


def test_from_record_tunes_what_had_no_exact_entry(tmp_path):
    path = _write(tmp_path / "rec.json", {
        _key(32): _call(32, 5, {"exact": 5}),
        _key(64): _call(64, 2, {f"nearest {_key(32)}": 2}),
        _key(1024, "gated_norm_bwd"): _call(1024, 7, {"default": 6, "exact": 1}, "gated_norm_bwd"),
    })
    rp = combos_from_record(path)
    assert (rp.recorded, rp.exact, rp.skus) == (3, 1, ["h200"])
    assert [c.key for c in rp.combos] == [_key(1024, "gated_norm_bwd"), _key(64)]  # most-called first
    assert rp.combos[0].origins == ("recorded: 7 calls (default 6, exact 1)",)
    assert list(rp.combos[1].dims) == list(runtime_dims("gated_norm_fwd"))  # the kernel's key order
    forced = combos_from_record(path, force=True)
    assert [c.key for c in forced.combos] == [_key(1024, "gated_norm_bwd"), _key(32), _key(64)]


def runtime_dims(kernel: str) -> tuple[str, ...]:
    from autotune_cli.tuning import get

    return get(kernel).dims


runner = CliRunner()


def test_sweep_from_record_cpu_dry_run_tunes_exactly_the_recorded_keys(tmp_path, bundles_at):
    """The documented loop on CPU: record a real call, then tune what it recorded."""
    bundles_at()
    rec = tmp_path / "calls.json"
    with torch.no_grad(), mamba_tune.record_calls(rec):
        _norm(48)
        _norm(48)
    recorded = set(json.loads(rec.read_text())["calls"])
    assert recorded == {_key(48)}
    out = tmp_path / "out"
    r = runner.invoke(app, ["sweep", "--from-record", str(rec), "--cpu-dry-run", "-o", str(out),
                            "--log-dir", str(tmp_path / "logs")])
    assert r.exit_code == 0, r.output
    b = load_bundle(out / "cpu" / "calls.json")
    assert set(b.entries) == recorded and not b.failures
    assert b.provenance.spec is None
    # Run again: the bundle has the key now, so nothing is re-tuned.
    r = runner.invoke(app, ["sweep", "--from-record", str(rec), "--cpu-dry-run", "-o", str(out),
                            "--log-dir", str(tmp_path / "logs")])
    assert r.exit_code == 0 and "1 already in" in r.output and "0 to tune" in r.output, r.output


@pytest.mark.parametrize("calls,devices,extra,needle", [
    ({"k|rows=1|bf16": {"kernel": "k", "dims": {"rows": 1}, "dtype": "bf16", "calls": 1,
                        "served": {"default": 1}}}, ("cpu",), ["--cpu-dry-run"], "unknown kernel 'k'"),
    ({"gated_norm_fwd|rows=1|bf16": {"kernel": "gated_norm_fwd", "dims": {"rows": 1}, "dtype": "bf16", "calls": 1,
                                     "served": {"default": 1}}}, ("cpu",), ["--cpu-dry-run"],
     "gated_norm_fwd has dims rows, d, group_size"),
    ({_key(-1): _call(-1, 1, {"default": 1})}, ("cpu",), ["--cpu-dry-run"], "negative dims rows=-1"),
    ({entry_key("gated_norm_fwd", _dims(32), "int8"): {**_call(32, 1, {"default": 1}), "dtype": "int8"}},
     ("cpu",), ["--cpu-dry-run"], "unknown dtype 'int8'"),
    ({_key(32): _call(32, 1, {"default": 1})}, ("cpu",), [], "a CPU record); name the target with --gpu"),
    ({_key(32): _call(32, 1, {"default": 1})}, ("NVIDIA H200", "NVIDIA B200"), [],
     "calls ran on several GPUs (b200, h200); pick the target with --gpu"),
    ({_key(32): _call(32, 1, {"default": 1})}, ("cpu",), ["--gpu", "x100"], "--gpu 'x100': unknown GPU"),
    ({_key(32): _call(32, 1, {"default": 1})}, ("cpu",), [str(ROOT / "tests/data/tiny.yaml")],
     "give a SPEC or --from-record FILE (exactly one)"),
])
def test_sweep_from_bad_record_is_one_line_exit_2(tmp_path, calls, devices, extra, needle):
    path = _write(tmp_path / "rec.json", calls, devices)
    r = runner.invoke(app, ["sweep", "--from-record", str(path), "-o", str(tmp_path / "out"), *extra])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "out").exists()


def test_sweep_from_record_with_everything_exact_has_nothing_to_do(tmp_path):
    path = _write(tmp_path / "rec.json", {_key(32): _call(32, 3, {"exact": 3})})
    r = runner.invoke(app, ["sweep", "--from-record", str(path), "-o", str(tmp_path / "out")])
    assert r.exit_code == 0 and "nothing to tune" in r.output, r.output
    r = runner.invoke(app, ["sweep", str(ROOT / "tests/data/tiny.yaml"), "--gpu", "h200"])
    assert r.exit_code == 2 and "--gpu and --name go with --from-record" in r.output, r.output


@pytest.mark.parametrize("name,stem,needle", [
    ("../../x", "rec", "--name '../../x' is not a safe file name"),
    (None, "..rec", "the record's file stem '..rec' is not a safe file name"),
])
def test_sweep_from_record_refuses_a_bundle_name_that_leaves_out(tmp_path, name, stem, needle):
    """--name (or the record's stem) becomes OUT/SKU/NAME.json, its lock and its log folder:
    checked by the rule `tune --name` follows, before anything is written."""
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    path = _write(work / f"{stem}.json", {_key(32): _call(32, 1, {"default": 1})}, ("cpu",))
    args = ["sweep", "--from-record", str(path), "--cpu-dry-run", "-o", str(work / "out"),
            "--log-dir", str(work / "logs")]
    r = runner.invoke(app, [*args, *(["--name", name] if name else [])])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [path.name]


def test_env_var_naming_a_file_no_lock_can_be_made_for_fails_at_once(tmp_path):
    """MAMBA_TUNE_RECORD=/proc/1/x.json: no lock file can be created there, which filelock
    retries for as long as it waits (for ever without a timeout): one error naming the
    variable at import, well before the test's timeout."""
    (tmp_path / "no-bundles").mkdir()
    env = {**os.environ, "HELION_INTERPRET": "1", "MAMBA_TUNE_RECORD": "/proc/1/x.json",
           "MAMBA_TUNE_CONFIGS": str(tmp_path / "no-bundles")}
    code = ("import torch, mamba_tune\nx = torch.randn(32, 64, dtype=torch.bfloat16)\n"
            "with torch.no_grad():\n    mamba_tune.rmsnorm_fn(x, torch.ones(64), None, z=x, group_size=32)\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.endswith("MAMBA_TUNE_RECORD=/proc/1/x.json: cannot create its lock file /proc/1/x.json.lock: "
                         "No such file or directory"), p.stderr[-2000:]


def test_merge_into_waits_for_a_held_lock_a_bounded_time(tmp_path, monkeypatch):
    """A record lock another process holds: merge_into gives up after LOCK_TIMEOUT_S with one line."""
    path = tmp_path / "rec.json"
    hold = ("import sys\nfrom filelock import FileLock\nwith FileLock(sys.argv[1] + '.lock'):\n"
            "    print('held', flush=True)\n    sys.stdin.read()\n")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    monkeypatch.setattr(record, "LOCK_TIMEOUT_S", 1.0)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        new = {**record.empty_record(), "devices": ["cpu"], "calls": {_key(32): _call(32, 1, {"default": 1})}}
        with pytest.raises(record.RecordError, match=r"rec.json.lock was held for over 1 s"):
            record.merge_into(path, new)
    finally:
        holder.communicate("", timeout=60)
    assert not path.exists()
