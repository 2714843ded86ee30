"""`mamba-tune verify`: the rules on the CPU; the real run on the GPU (`pytest -m gpu`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import review_fixtures as fx
import torch
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.review.verify import Margins, target_problem, timing_reasons

runner = CliRunner()
TINY = Path(__file__).resolve().parent.parent / "data" / "tiny.yaml"


def test_target_problem() -> None:
    assert target_problem(fx.H200, fx.H100) is None  # same compute capability 9.0
    a100 = fx.GpuInfo(name="NVIDIA A100-SXM4-80GB", sku="a100", arch="sm80", compute_capability="8.0", sm_count=108)
    msg = target_problem(fx.H200, a100)
    assert msg is not None and "sm 9.0" in msg and "sm 8.0" in msg and "--allow-arch-mismatch" in msg


@pytest.mark.parametrize(("tuned", "default", "same", "want"), [
    (0.100, 0.150, False, []),
    (0.102, 0.100, False, []),  # 2% slower than default: within the 3% noise margin
    (0.104, 0.100, False, ["slower than the kernel's default config"]),
    (0.104, 0.104, True, []),  # the tuned config is the default one: no comparison
    (0.115, 0.200, False, ["regressed vs the recorded timing"]),  # recorded 0.100, +15% > 10%
    (0.130, 0.120, False, ["slower than the kernel's default config", "regressed vs the recorded timing"]),
], ids=["faster", "within-noise", "slower-than-default", "is-default", "regressed", "both"])
def test_timing_reasons(tuned: float, default: float, same: bool, want: list[str]) -> None:
    e = fx.entry(tuned=0.100, default=0.150)
    reasons = timing_reasons(e, tuned, default, same, Margins(noise_pct=3.0, regression_pct=10.0))
    assert len(reasons) == len(want)
    for r, w in zip(reasons, want, strict=True):
        assert r.startswith(w)


def test_margins_are_options() -> None:
    e = fx.entry(tuned=0.100, default=0.150)
    assert timing_reasons(e, 0.115, 0.2, False, Margins(regression_pct=20.0)) == []
    assert timing_reasons(e, 0.104, 0.1, False, Margins(noise_pct=5.0)) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_no_gpu_is_exit_2(tmp_path: Path) -> None:
    src = fx.write(fx.bundle([fx.entry()]), tmp_path / "b.json")
    res = runner.invoke(app, ["verify", str(src)])
    assert res.exit_code == 2
    assert "no CUDA GPU visible" in res.stderr and "NVIDIA H200" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_bad_inputs(tmp_path: Path) -> None:
    res = runner.invoke(app, ["verify", str(tmp_path / "missing.json")])
    assert res.exit_code == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema_version": 2}')
    res = runner.invoke(app, ["verify", str(bad)])
    assert res.exit_code == 2 and "schema_version 2 is not supported" in res.stderr
    src = fx.write(fx.bundle([fx.entry()]), tmp_path / "b.json")
    res = runner.invoke(app, ["verify", str(src), "--kernel", "ssd_nope"])
    assert res.exit_code == 2 and "no entries of that kernel" in res.stderr
    res = runner.invoke(app, ["verify", str(src), "--noise-pct", "-1"])
    assert res.exit_code == 2


# --- on the GPU -------------------------------------------------------------------------


@pytest.mark.gpu
def test_verify_on_gpu(tmp_path: Path) -> None:
    """Tune the tiny spec's norm combos with their default configs (effort none), then verify
    them for real: all pass; a config that cannot compile and a recorded time that is far too
    fast are caught."""
    from autotune_cli import environment as env
    from autotune_cli.plan import plan
    from autotune_cli.spec import load_spec
    from autotune_cli.tuner import tune
    from mamba_tune.bundle import Bundle, KernelProvenance, Provenance, write_bundle

    spec = load_spec(TINY)
    budget = spec.budget.model_copy(update={"effort": "none"})
    combos = plan(spec)[:2]  # one fwd, one bwd
    outcomes = [tune(c.kernel, c.dims, c.dtype, budget, spec.tolerances[c.dtype]) for c in combos]
    assert all(o.entry is not None for o in outcomes), [o.failure for o in outcomes]
    prov = Provenance(tool_version=env.tool_version(), created=env.now(), updated=env.now(), gpu=env.gpu_info(),
                      versions=env.versions(), kernels={c.kernel: KernelProvenance(source_sha256=o.kernel.source_sha256)
                                                        for c, o in zip(combos, outcomes, strict=True)})
    good = Bundle(provenance=prov, entries={o.entry.key: o.entry for o in outcomes if o.entry})
    path = tmp_path / "tiny.json"
    write_bundle(good, path)
    # Tiny kernels time in microseconds and are host-bound: on a shared H200 host the 12 us norm
    # backward re-timed at 38 us seconds later. A wide regression margin keeps this
    # about the flow; the /100 case below checks that a regression is caught.
    res = runner.invoke(app, ["verify", str(path), "--json-out", str(tmp_path / "v.json"), "--regression-pct", "1000"])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["ok"] and len(data["entries"]) == 2
    for e in data["entries"]:
        assert e["same_as_default"] and e["tuned_ms"] > 0 and e["max_abs_err"]

    fwd, bwd = (o.entry for o in outcomes)
    assert fwd is not None and bwd is not None
    # One block size more than the kernel tiles (a value no config may hold fails the load instead).
    broken = fwd.model_copy(update={"config": fwd.config | {"block_sizes": [*fwd.config["block_sizes"], 16]}})
    fast = bwd.model_copy(update={"timing": bwd.timing.model_copy(update={"tuned_ms": bwd.timing.tuned_ms / 100})})
    write_bundle(good.model_copy(update={"entries": {broken.key: broken, fast.key: fast}}), path)
    res = runner.invoke(app, ["verify", str(path), "--json-out", str(tmp_path / "v.json")])
    assert res.exit_code == 1, res.output
    reasons = {e["key"]: e["reasons"] for e in json.loads((tmp_path / "v.json").read_text())["entries"]}
    assert reasons[broken.key] and not reasons[broken.key][0].startswith("regressed")
    assert any(r.startswith("regressed vs the recorded timing") for r in reasons[fast.key])


def test_results_table_and_json() -> None:
    """The rendering of a verify run (results built by hand: the GPU run is test_verify_on_gpu)."""
    from rich.console import Console

    from autotune_cli.commands.review import _verify_table
    from autotune_cli.review.verify import EntryResult, VerifyResult

    good = EntryResult("k|a=1|bf16", True, [], 0.1, 0.15, tuned_ms=0.098, default_ms=0.15)
    bad = EntryResult("k|a=2|bf16", False, ["does not compile: CompileError: bad [num_warps]"], 0.1, 0.15)
    res = VerifyResult(gpu=fx.H200, versions=fx.VERSIONS, bundle_gpu=fx.H200, bundle_versions=fx.VERSIONS,
                       margins=Margins(), started="2026-11-29T00:00:00+00:00", results=[good, bad])
    con = Console(width=250, record=True)
    con.print(_verify_table(res, "b.json"))
    text = con.export_text()
    assert "verify b.json: 1/2 ok" in text
    assert "0.0980" in text and "1.53x" in text and "-2.0%" in text
    assert "bad [num_warps]" in text  # plain text, not rich markup
    data = res.to_json("b.json")
    assert data["ok"] is False and data["gpu"]["name"] == "NVIDIA H200" and data["margins"]["noise_pct"] == 3.0
    assert [e["ok"] for e in data["entries"]] == [True, False]
    assert data["entries"][0]["vs_recorded_pct"] == pytest.approx(-2.0)
