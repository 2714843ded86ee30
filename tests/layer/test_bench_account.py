"""The step account (`mamba-tune bench --family layer --account`) without a GPU: its byte and FLOP
counts against the tensors the stages read and write, the arithmetic of its summary rows, its
table and its arguments. The timings themselves need the GPU (the gpu-marked test at the end)."""

from __future__ import annotations

import json

import pytest
import torch
from bench_cli import assert_bench_refuses
from typer.testing import CliRunner

from autotune_cli.app import app
from autotune_cli.benchmarks import account, layer
from autotune_cli.presets import MODEL_PRESETS, ModelDims

runner = CliRunner()
TINY = ModelDims(d_model=32, nheads=4, headdim=8, ngroups=2, dstate=16, chunk_size=16)


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_the_byte_counts_are_the_stages_tensors():
    """Each stage's bytes are those of the tensors it reads and writes, built at a small shape as
    the layer benchmark builds them (bf16, rstd fp32)."""
    s = layer.layer_shape(TINY, 1, 2, 48)
    i = layer.LayerInputs.make(s, torch.bfloat16, device="cpu")
    e, t = 2, s.batch * s.seqlen
    act = lambda n: torch.empty(t, n, dtype=torch.bfloat16)  # noqa: E731  (an activation (T, n))
    zxbcdt, xBC, y, z, normed, rstd = act(s.d_in_proj), act(s.conv_dim), act(s.dim), act(s.dim), act(s.dim), \
        torch.empty(t, s.ngroups, dtype=torch.float32)
    x, dt, BC, out = act(s.dim), act(s.nheads), act(2 * s.ngroups * s.dstate), act(s.d_model)
    conv_params = _nbytes(i.conv_weight, i.conv_bias)
    assert account.in_proj_fwd(s, e).nbytes == _nbytes(i.u, i.in_proj, zxbcdt)
    assert account.conv1d_fwd(s, e).nbytes == _nbytes(xBC, xBC) + conv_params
    assert account.ssd_fwd(s, e).nbytes == _nbytes(x, dt, BC, y)
    assert account.norm_fwd(s, e).nbytes == _nbytes(y, z, i.norm_weight, normed, rstd)
    assert account.out_proj_fwd(s, e).nbytes == _nbytes(normed, i.out_proj, out)
    # Backward: reads, then writes.
    assert account.out_proj_bwd(s, e).nbytes == _nbytes(i.dout, i.out_proj, normed) + _nbytes(i.dout, normed,
                                                                                               i.out_proj)
    assert account.norm_bwd(s, e).nbytes == _nbytes(normed, y, z, rstd, i.norm_weight) + _nbytes(y, z, normed)
    assert account.ssd_bwd(s, e).nbytes == _nbytes(x, y, dt, BC) + _nbytes(x, dt, BC)
    # The bias too: SiLU's derivative needs the pre-activation, recomputed from xBC.
    assert account.conv1d_bwd(s, e).nbytes == _nbytes(xBC, xBC) + conv_params + _nbytes(xBC) + conv_params
    assert account.in_proj_bwd(s, e).nbytes == _nbytes(zxbcdt, i.in_proj, i.u) + _nbytes(zxbcdt, i.u, i.in_proj)


def test_the_flop_counts():
    """GEMMs: 2 m n k per product (the backward's two products each); the SSD: its products by hand
    at Nemotron-3 Nano's dims; elementwise stages: none."""
    s = layer.layer_shape(MODEL_PRESETS["nemotron-3-nano-30b"], 1, 2, 8192)
    t = 16384
    assert account.in_proj_fwd(s, 2).flops == 2 * t * 2688 * 10304
    assert account.in_proj_bwd(s, 2).flops == 2 * account.in_proj_fwd(s, 2).flops
    assert account.out_proj_fwd(s, 2).flops == 2 * t * 4096 * 2688
    assert account.out_proj_bwd(s, 2).flops == 2 * account.out_proj_fwd(s, 2).flops
    # Per chunk of 128 tokens: C B^T's lower half for 8 groups (128 * 128 / 2 * 128 * 2 each), the
    # chunk states and the output from them for 64 heads (2 * 128 * 64 * 128 each), the intra-chunk
    # output's lower half (128 * 128 / 2 * 64 * 2 per head).
    per_chunk = 8 * 128 * 128 * 128 + 2 * 64 * (2 * 128 * 64 * 128) + 64 * 128 * 128 * 64
    assert account.ssd_fwd(s, 2).flops == t // 128 * per_chunk
    assert account.ssd_bwd(s, 2).flops == 2 * account.ssd_fwd(s, 2).flops
    assert all(f(s, 2).flops == 0 for f in (account.conv1d_fwd, account.norm_fwd, account.norm_bwd,
                                            account.conv1d_bwd))


def test_a_bound_is_the_longer_of_bytes_and_flops():
    assert account.Work(3_000_000_000, 0).bound_ms(3000.0, 600.0) == (pytest.approx(1.0), "bytes")
    assert account.Work(3_000_000, 1_200_000_000_000).bound_ms(3000.0, 600.0) == (pytest.approx(2.0), "flops")


def _times() -> dict[str, tuple[float | None, float | None]]:
    # Stage rows (ours, mamba-ssm); GEMM rows carry no baseline, as the layer benchmark times them.
    return {"in_proj": (1.0, None), "conv1d": (0.1, 0.2), "ssd": (0.5, 0.7), "norm": (0.15, 0.15),
            "out_proj": (0.5, None), "out_proj_bwd": (1.0, None), "norm_bwd_recompute": (0.3, 0.5),
            "ssd_bwd": (1.5, 2.5), "conv1d_bwd": (0.6, 0.3), "in_proj_bwd": (2.0, None),
            "layer_fwd_bwd": (9.0, 10.0), "layer_fwd_bwd_wall": (9.5, 10.2), "layer_fwd_bwd_graph": (8.9, 10.0)}


def test_the_summary_rows_are_the_steps_arithmetic():
    s = layer.layer_shape(TINY, 1, 2, 48)
    rows = {r["stage"]: r for r in account.account_rows(s, 2, _times(), 3000.0, 600.0)}
    assert list(rows) == [st.name for st in account.ACCOUNT] + ["stages", "rest", "step", "gemm", "non-gemm",
                                                                 "step wall", "step graph", "host"]
    # The conv1d is run twice (forward, and recomputed in the backward): both rows take its time.
    stages_o = 1.0 + 0.1 + 0.5 + 0.15 + 0.5 + 1.0 + 0.1 + 0.3 + 1.5 + 0.6 + 2.0
    stages_b = 1.0 + 0.2 + 0.7 + 0.15 + 0.5 + 1.0 + 0.2 + 0.5 + 2.5 + 0.3 + 2.0
    assert rows["stages"]["ours_ms"] == pytest.approx(stages_o)
    assert rows["stages"]["baseline_ms"] == pytest.approx(stages_b)
    assert rows["rest"]["ours_ms"] == pytest.approx(9.0 - stages_o)
    assert rows["rest"]["baseline_ms"] == pytest.approx(10.0 - stages_b)
    assert rows["gemm"]["ours_ms"] == rows["gemm"]["baseline_ms"] == pytest.approx(4.5)
    assert rows["non-gemm"]["ours_ms"] == pytest.approx(4.5)
    assert rows["non-gemm"]["baseline_ms"] == pytest.approx(5.5)
    assert rows["non-gemm"]["ratio"] == pytest.approx(5.5 / 4.5)
    assert rows["host"]["ours_ms"] == pytest.approx(0.6)
    assert rows["host"]["baseline_ms"] == pytest.approx(0.2)
    assert rows["bwd conv1d"]["ratio"] == pytest.approx(0.5)
    assert rows["bwd in_proj"]["baseline_ms"] == 2.0 and rows["bwd in_proj"]["ratio"] == 1.0
    # Bounds: each stage's, and the totals' are sums of them.
    for st in account.ACCOUNT:
        bound, by = st.work(s, 2).bound_ms(3000.0, 600.0)
        assert rows[st.name]["bound_ms"] == bound and rows[st.name]["bound_by"] == by
        assert rows[st.name]["pct_of_bound"] == pytest.approx(100 * bound / rows[st.name]["ours_ms"])
    gemm = sum(rows[st.name]["bound_ms"] for st in account.ACCOUNT if st.gemm)
    other = sum(rows[st.name]["bound_ms"] for st in account.ACCOUNT if not st.gemm)
    assert rows["gemm"]["bound_ms"] == pytest.approx(gemm)
    assert rows["non-gemm"]["bound_ms"] == pytest.approx(other)
    assert rows["step"]["bound_ms"] == pytest.approx(account.Work(
        sum(st.work(s, 2).nbytes for st in account.ACCOUNT),
        sum(st.work(s, 2).flops for st in account.ACCOUNT)).bound_ms(3000.0, 600.0)[0])
    assert rows["rest"]["bound_ms"] is None and rows["host"]["pct_of_bound"] is None


def test_the_stages_graph_times_are_carried_and_summed():
    """The stage rows replayed from CUDA graphs: beside do_bench's, a GEMM's on both sides, their sum
    in "stages"; none on the other summary rows. Without them (older result files) all None."""
    s = layer.layer_shape(TINY, 1, 2, 48)
    graphs = {k: (0.9 * o, None if b is None else 0.8 * b) for k, (o, b) in _times().items()
              if not k.startswith("layer_")}
    rows = {r["stage"]: r for r in account.account_rows(s, 2, _times(), 3000.0, 600.0, graphs=graphs)}
    assert rows["fwd ssd"]["ours_graph_ms"] == pytest.approx(0.45)
    assert rows["fwd ssd"]["baseline_graph_ms"] == pytest.approx(0.56)
    assert rows["fwd ssd"]["graph_ratio"] == pytest.approx(0.56 / 0.45)
    assert rows["fwd ssd"]["ours_ms"] == 0.5  # do_bench's stays as it was
    assert rows["bwd in_proj"]["baseline_graph_ms"] == rows["bwd in_proj"]["ours_graph_ms"] == pytest.approx(1.8)
    ours = sum(rows[st.name]["ours_graph_ms"] for st in account.ACCOUNT)
    base = sum(rows[st.name]["baseline_graph_ms"] for st in account.ACCOUNT)
    assert rows["stages"]["ours_graph_ms"] == pytest.approx(ours)
    assert rows["stages"]["baseline_graph_ms"] == pytest.approx(base)
    assert base == pytest.approx(0.9 * (1.0 + 0.5 + 1.0 + 2.0) + 0.8 * (0.2 + 0.7 + 0.15 + 0.2 + 0.5 + 2.5 + 0.3))
    assert all(rows[k]["ours_graph_ms"] is None for k in ("rest", "step", "non-gemm", "host"))
    plain = {r["stage"]: r for r in account.account_rows(s, 2, _times(), 3000.0, 600.0)}
    assert all(r["ours_graph_ms"] is None and r["graph_ratio"] is None for r in plain.values())
    # account_for reads them from the bench rows' graph keys.
    bench = [{"model": "a", "stage": k, "ours_ms": o, "baseline_ms": b} for k, (o, b) in _times().items()]
    for r in bench:
        r["ours_graph_ms"], r["baseline_graph_ms"] = graphs.get(r["stage"], (None, None))
    by = {r["stage"]: r for r in account.account_for("a", s, bench, 2, 3000.0, 600.0)}
    assert by["stages"]["ours_graph_ms"] == pytest.approx(ours)


def test_a_missing_side_leaves_its_sums_empty():
    """No mamba-ssm (baseline None everywhere but the GEMMs, which take ours), no CUDA graph."""
    s = layer.layer_shape(TINY, 1, 2, 48)
    times = {k: (o, None) for k, (o, _b) in _times().items()}
    times["layer_fwd_bwd_graph"] = (None, None)
    rows = {r["stage"]: r for r in account.account_rows(s, 2, times, 3000.0, 600.0)}
    assert rows["fwd ssd"]["baseline_ms"] is None and rows["fwd ssd"]["ratio"] is None
    assert rows["gemm"]["baseline_ms"] == pytest.approx(4.5)
    assert rows["stages"]["baseline_ms"] is None and rows["rest"]["baseline_ms"] is None
    assert rows["non-gemm"]["baseline_ms"] is None and rows["non-gemm"]["ours_ms"] == pytest.approx(4.5)
    assert rows["host"]["ours_ms"] is None and rows["step wall"]["ours_ms"] == 9.5


def test_account_for_reads_its_models_rows_and_the_module_step():
    s = layer.layer_shape(TINY, 1, 2, 48)
    bench = [{"model": "a", "stage": k, "ours_ms": o, "baseline_ms": b} for k, (o, b) in _times().items()]
    bench += [{"model": "b", "stage": "ssd", "ours_ms": 100.0, "baseline_ms": 1.0}]
    rows = account.account_for("a", s, bench, 2, 3000.0, 600.0)
    assert {r["model"] for r in rows} == {"a"} and all(r["family"] == "layer-account" for r in rows)
    assert next(r for r in rows if r["stage"] == "fwd ssd")["ours_ms"] == 0.5
    module = bench + [{"model": "a", "stage": "module_train_step_mem_eff", "ours_ms": 9.2, "baseline_ms": 9.9}]
    rows = account.account_for("a", s, module, 2, 3000.0, 600.0, family="module")
    step = next(r for r in rows if r["stage"] == "step")
    assert (step["family"], step["ours_ms"], step["baseline_ms"]) == ("module-account", 9.2, 9.9)


def test_the_table_has_the_accounts_columns_and_rows():
    from rich.console import Console

    s = layer.layer_shape(MODEL_PRESETS["nemotron-3-nano-30b"], 1, 2, 8192)  # GEMMs bound by FLOPs
    console = Console(width=200, record=True)
    console.print(account.table("t", account.account_rows(s, 2, _times(), 3000.0, 600.0)))
    text = console.export_text()
    for word in ("stage", "ours ms", "mamba-ssm ms", "ratio", "ours graph", "mamba-ssm graph", "graph ratio",
                 "bound ms", "% of bound (ours)", "fwd in_proj",
                 "bwd conv1d recompute", "non-gemm", "host", "0.50x", "(bytes)", "(flops)"):
        assert word in text, word


@pytest.mark.parametrize("args,message", [
    (["--family", "norm", "--account"], "--account: only with --family layer or module"),
    (["--family", "ssd", "--account"], "--account: only with --family layer or module"),
])
def test_account_rejects_other_families(tmp_path, args, message):
    assert_bench_refuses(tmp_path, args, message)


def test_account_is_in_the_help():
    r = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--account" in r.output and "training step's account" in r.output


@pytest.mark.usefixtures("layer_ref_mode")
def test_the_account_stages_of_ours_run():
    """Every layer row the account reads of ours' stages runs (CPU, ref mode, tiny dims)."""
    s = layer.layer_shape(TINY, 1, 2, 40)
    i = layer.LayerInputs.make(s, torch.float32, device="cpu")
    ours, _ = layer._stage_fns(s, i, account.STAGE_ROWS)
    assert set(ours) >= set(account.STAGE_ROWS)  # each also timed from a graph (`_bench_shape`)
    for row in account.STAGE_ROWS:
        assert ours[row]() is not None, row
    dnormed, dw = ours["out_proj_bwd"]()
    assert tuple(dnormed.shape) == (2, 40, s.dim) and tuple(dw.shape) == tuple(i.out_proj.shape)
    du, dw = ours["in_proj_bwd"]()
    assert tuple(du.shape) == (80, s.d_model) and tuple(dw.shape) == tuple(i.in_proj.shape)


@pytest.mark.gpu
def test_account_on_the_gpu(tmp_path):
    """The account at a small shape on the GPU: every stage row timed on ours' side, the JSON
    holding the rows the table prints."""
    out = tmp_path / "bench.json"
    r = runner.invoke(app, ["bench", "--family", "layer", "--model", "nemotron-3-nano-30b", "--tp", "8",
                            "--batch", "1", "--seqlen", "512", "--account", "--json-out", str(out)])
    assert r.exit_code == 0, r.output
    rows = [row for row in json.loads(out.read_text())["rows"] if row["family"] == "layer-account"]
    by = {row["stage"]: row for row in rows}
    assert all(by[st.name]["ours_ms"] > 0 and by[st.name]["bound_ms"] > 0 for st in account.ACCOUNT)
    assert all(by[st.name]["ours_graph_ms"] > 0 for st in account.ACCOUNT)  # every stage of ours captures
    assert by["rest"]["ours_ms"] == pytest.approx(by["step"]["ours_ms"] - by["stages"]["ours_ms"])
    assert "non-gemm" in r.output and "% of bound (ours)" in r.output
