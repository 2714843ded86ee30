"""The training step's account (`mamba-tune bench --family layer --account`): every stage of one
Mamba-2 layer's forward + backward on both sides, each against its bound, and what is left.

A stage's bound is the time its compulsory work takes at this GPU's measured rates: the bytes it
must move (each input read once, each output written once: what a kernel that keeps everything
else on chip moves) at the device-to-device copy bandwidth (`common.copy_gbps`), or its
tensor-core FLOPs at the rate of a GEMM in the benchmark's dtype, (tokens, 4096) x (4096, 4096),
measured in the same process (`common.gemm_tflops`), whichever is longer. "% of bound" = bound / ours: 100% is a stage at its bound.

The stages are the layer benchmark's rows (`benchmarks/layer.py`), timed alone with do_bench (L2
flushed, so a stage alone can take longer than in the step, where its input may still be in L2):
`ACCOUNT` maps each account row to the layer row that times it. The GEMMs are the same torch calls
on both sides, timed once. Each stage is also timed replayed from a CUDA graph (do_bench of one
captured call: "ours graph" and "mamba-ssm graph", their ratio "graph ratio"): its GPU time
alone. do_bench counts the host time of a stage's launches where the GPU waits for them (many
small kernels, a slow host), so where the two differ the stage is host-bound there; the graph
columns are what to compare kernels by. The summary rows:
- "stages": the sum of the stage rows (its graph columns: of the stages' graph times);
- "rest": the step minus that sum: the kernels no stage row names (copies, casts, the small
  parameter-gradient reductions), launch gaps and host time that the GPU waits for;
- "step": the whole forward + backward (do_bench median);
- "gemm": the GEMM rows' sum; "non-gemm": the step minus it (what the kernels other than the
  GEMMs, and the gaps, cost: the issue's target is this row's ratio);
- "step wall": back-to-back steps timed on the host; "step graph": the same steps replayed
  from a CUDA graph (no host work); "host": wall minus graph, the host time per step the GPU
  does not hide.

The byte and FLOP counts below are functions of the layer's shape (`LayerShape`: T = batch *
seqlen tokens) and the activation dtype's size `e` (weights in the same dtype; rstd fp32).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # layer.py loads torch and the kernels; the formulas need only the sizes
    from autotune_cli.benchmarks.layer import LayerShape


@dataclasses.dataclass(frozen=True)
class Work:
    """A stage's compulsory work: bytes moved to and from GPU memory, tensor-core FLOPs."""

    nbytes: int
    flops: int = 0

    def bound_ms(self, copy_gbps: float, gemm_tflops: float) -> tuple[float, str]:
        """(the time of the work at the measured rates, "bytes" or "flops": which one bounds it)."""
        by_bytes = self.nbytes / (copy_gbps * 1e9) * 1e3
        by_flops = self.flops / (gemm_tflops * 1e12) * 1e3
        return (by_flops, "flops") if by_flops > by_bytes else (by_bytes, "bytes")


def _tokens(s: LayerShape) -> int:
    return s.batch * s.seqlen


def in_proj_fwd(s: LayerShape, e: int) -> Work:
    """zxbcdt = u W_in^T: reads u (T, d_model) and W_in (d_in_proj, d_model), writes zxbcdt (T, d_in_proj)."""
    t = _tokens(s)
    return Work(e * (t * s.d_model + s.d_in_proj * s.d_model + t * s.d_in_proj), 2 * t * s.d_model * s.d_in_proj)


def conv1d_fwd(s: LayerShape, e: int, width: int = 4) -> Work:
    """The causal conv1d + SiLU: reads xBC (T, conv_dim), the weight (conv_dim, width) and bias,
    writes the activated output (T, conv_dim). Also the backward's recompute of it."""
    t = _tokens(s)
    return Work(e * (2 * t * s.conv_dim + s.conv_dim * (width + 1)))


def ssd_flops(s: LayerShape) -> int:
    """The chunked SSD forward's tensor-core FLOPs (Q = chunk_size, causal halves counted once):
    C B^T within chunks (T Q ngroups dstate), the chunk states and the output from them
    (2 T nheads headdim dstate each), the intra-chunk output (T Q nheads headdim)."""
    t, q = _tokens(s), s.chunk_size
    return t * (q * s.ngroups * s.dstate + 4 * s.nheads * s.headdim * s.dstate + q * s.nheads * s.headdim)


def ssd_fwd(s: LayerShape, e: int) -> Work:
    """The SSD forward: reads x (T, dim), dt (T, nheads), B and C (T, ngroups * dstate each), writes
    y (T, dim) (A, D, dt_bias and the final states are parameter-sized: left out)."""
    t, bc = _tokens(s), 2 * s.ngroups * s.dstate
    return Work(e * t * (s.dim + s.nheads + bc + s.dim), ssd_flops(s))


def norm_fwd(s: LayerShape, e: int) -> Work:
    """The gated RMSNorm: reads y and z (T, dim) and the weight (dim), writes the output (T, dim)
    and rstd (T, ngroups) fp32."""
    t = _tokens(s)
    return Work(e * (3 * t * s.dim + s.dim) + 4 * t * s.ngroups)


def out_proj_fwd(s: LayerShape, e: int) -> Work:
    """out = normed W_out^T: reads normed (T, dim) and W_out (d_model, dim), writes out (T, d_model)."""
    t = _tokens(s)
    return Work(e * (t * s.dim + s.d_model * s.dim + t * s.d_model), 2 * t * s.dim * s.d_model)


def out_proj_bwd(s: LayerShape, e: int) -> Work:
    """dnormed = dout W_out (reads dout (T, d_model) and W_out, writes dnormed (T, dim)) and
    dW_out = dout^T normed (reads dout and normed (T, dim), writes dW_out (d_model, dim))."""
    t = _tokens(s)
    return Work(e * (2 * t * s.d_model + 2 * t * s.dim + 2 * s.d_model * s.dim), 4 * t * s.dim * s.d_model)


def norm_bwd(s: LayerShape, e: int) -> Work:
    """The gated RMSNorm's backward with its output recomputed for out_proj's weight gradient:
    reads dnormed, y and z (T, dim), rstd (T, ngroups) fp32 (mamba-ssm's kept one; ours
    recomputes it in the pass) and the weight, writes dy, dz and normed (T, dim each) (the weight
    gradient's partials are parameter-sized: left out)."""
    t = _tokens(s)
    return Work(e * (6 * t * s.dim + s.dim) + 4 * t * s.ngroups)


def ssd_bwd(s: LayerShape, e: int) -> Work:
    """The SSD backward: reads x and dy (T, dim), dt (T, nheads), B and C; writes dx (T, dim),
    ddt (T, nheads), dB and dC. FLOPs: each forward product's two gradients, twice the forward's
    (the recompute of the forward's intermediates is not compulsory: left out)."""
    t, bc = _tokens(s), 2 * s.ngroups * s.dstate
    return Work(e * t * (3 * s.dim + 2 * s.nheads + 2 * bc), 2 * ssd_flops(s))


def conv1d_bwd(s: LayerShape, e: int, width: int = 4) -> Work:
    """The conv1d's backward (SiLU's recomputed inside): reads xBC and the output gradient
    (T, conv_dim), the weight; writes dxBC (T, conv_dim), the weight and bias gradients."""
    t = _tokens(s)
    return Work(e * (3 * t * s.conv_dim + 2 * s.conv_dim * (width + 1)))


def in_proj_bwd(s: LayerShape, e: int) -> Work:
    """du = dzxbcdt W_in (reads dzxbcdt (T, d_in_proj) and W_in, writes du (T, d_model)) and
    dW_in = dzxbcdt^T u (reads dzxbcdt and u (T, d_model), writes dW_in (d_in_proj, d_model))."""
    t = _tokens(s)
    return Work(e * (2 * t * s.d_in_proj + 2 * t * s.d_model + 2 * s.d_in_proj * s.d_model),
                4 * t * s.d_model * s.d_in_proj)


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str  # the account's row
    row: str  # the layer benchmark's row that times it
    work: Callable[[LayerShape, int], Work]
    gemm: bool = False


# The training step's stages in the order they run (both sides run each; both recompute the
# norm's output inside the norm's backward: the "norm_bwd_recompute" row).
ACCOUNT = (
    Stage("fwd in_proj", "in_proj", in_proj_fwd, gemm=True),
    Stage("fwd conv1d", "conv1d", conv1d_fwd),
    Stage("fwd ssd", "ssd", ssd_fwd),
    Stage("fwd norm", "norm", norm_fwd),
    Stage("fwd out_proj", "out_proj", out_proj_fwd, gemm=True),
    Stage("bwd out_proj", "out_proj_bwd", out_proj_bwd, gemm=True),
    Stage("bwd conv1d recompute", "conv1d", conv1d_fwd),
    Stage("bwd norm", "norm_bwd_recompute", norm_bwd),
    Stage("bwd ssd", "ssd_bwd", ssd_bwd),
    Stage("bwd conv1d", "conv1d_bwd", conv1d_bwd),
    Stage("bwd in_proj", "in_proj_bwd", in_proj_bwd, gemm=True),
)
# The layer rows the account reads: the stages, then the step timed three ways.
LAYER_STEP = ("layer_fwd_bwd", "layer_fwd_bwd_wall", "layer_fwd_bwd_graph")
MODULE_STEP = ("module_train_step_mem_eff", "module_train_step_wall_mem_eff", "module_train_step_graph_mem_eff")
STAGE_ROWS = tuple(dict.fromkeys(st.row for st in ACCOUNT))

Times = Mapping[str, tuple[float | None, float | None]]  # row -> (ours ms, mamba-ssm ms)
NO_TIMES: Times = {}


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _sum(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _ratio(ours: float | None, base: float | None) -> float | None:
    return None if not ours or base is None else base / ours


def account_rows(s: LayerShape, elem_bytes: int, times: Times, copy_gbps: float, gemm_tflops: float,
                 step: tuple[str, str, str] = LAYER_STEP, graphs: Times = NO_TIMES) -> list[dict[str, Any]]:
    """The account's rows from the timed rows (`times`, do_bench; `graphs`, the stage rows
    replayed from CUDA graphs; a missing row or side is None): each stage of `ACCOUNT`, then the
    summary rows (module docstring). `step` names the rows that time the whole step: do_bench,
    wall, CUDA graph. A GEMM row takes ours' time on both sides."""
    rows: list[dict[str, Any]] = []

    def add(name: str, ours: float | None, base: float | None, work: Work | None,
            graph: tuple[float | None, float | None] = (None, None), **extra: Any) -> None:
        row: dict[str, Any] = {"stage": name, "ours_ms": ours, "baseline_ms": base, "ratio": _ratio(ours, base),
                               "ours_graph_ms": graph[0], "baseline_graph_ms": graph[1],
                               "graph_ratio": _ratio(*graph),
                               "bound_ms": None, "bound_by": None, "pct_of_bound": None, **extra}
        if work is not None:
            row["bytes"], row["flops"] = work.nbytes, work.flops
            row["bound_ms"], row["bound_by"] = work.bound_ms(copy_gbps, gemm_tflops)
            row["pct_of_bound"] = None if not ours else 100 * row["bound_ms"] / ours
        rows.append(row)

    for st in ACCOUNT:
        ours, base = times.get(st.row, (None, None))
        ours_g, base_g = graphs.get(st.row, (None, None))
        if st.gemm:
            base, base_g = ours, ours_g
        add(st.name, ours, base, st.work(s, elem_bytes), (ours_g, base_g), gemm=st.gemm)
    stage_rows = list(rows)

    def total(pick: Callable[[dict[str, Any]], bool]) -> tuple[dict[str, float | None], Work]:
        """The picked stage rows' times summed, by key (None where one is missing), and their work."""
        chosen = [r for r in stage_rows if pick(r)]
        sums = {k: _sum([r[k] for r in chosen]) for k in ("ours_ms", "baseline_ms", "ours_graph_ms", "baseline_graph_ms")}
        return sums, Work(sum(r["bytes"] for r in chosen), sum(r["flops"] for r in chosen))

    every, all_w = total(lambda r: True)
    gemm, gemm_w = total(lambda r: r["gemm"])
    _, rest_w = total(lambda r: not r["gemm"])
    all_o, all_b, gemm_o, gemm_b = every["ours_ms"], every["baseline_ms"], gemm["ours_ms"], gemm["baseline_ms"]
    step_o, step_b = times.get(step[0], (None, None))
    wall_o, wall_b = times.get(step[1], (None, None))
    graph_o, graph_b = times.get(step[2], (None, None))
    add("stages", all_o, all_b, all_w, (every["ours_graph_ms"], every["baseline_graph_ms"]))
    add("rest", _sub(step_o, all_o), _sub(step_b, all_b), None)
    add("step", step_o, step_b, all_w)
    add("gemm", gemm_o, gemm_b, gemm_w)
    add("non-gemm", _sub(step_o, gemm_o), _sub(step_b, gemm_b), rest_w)
    add("step wall", wall_o, wall_b, None)
    add("step graph", graph_o, graph_b, None)
    add("host", _sub(wall_o, graph_o), _sub(wall_b, graph_b), None)
    return rows


def times_of(rows: list[dict[str, Any]], model: str,
             keys: tuple[str, str] = ("ours_ms", "baseline_ms")) -> dict[str, tuple[float | None, float | None]]:
    """The (ours, baseline) times of each benchmark row of `model`, by stage: do_bench's, or with
    keys ("ours_graph_ms", "baseline_graph_ms") the graph-replayed ones (None where a row has none)."""
    return {r["stage"]: (r.get(keys[0]), r.get(keys[1])) for r in rows if r.get("model") == model}


def table(title: str, rows: list[dict[str, Any]]) -> Any:
    """The account as a rich table: stage | ours ms | mamba-ssm ms | ratio | ours graph | mamba-ssm
    graph | graph ratio | bound ms | % of bound (ours)."""
    from rich.table import Table

    t = Table(title=title)
    for c in ("stage", "ours ms", "mamba-ssm ms", "ratio", "ours graph", "mamba-ssm graph", "graph ratio", "bound ms",
              "% of bound (ours)"):
        t.add_column(c, justify="left" if c == "stage" else "right")

    def f(v: float | None, fmt: str, suffix: str = "") -> str:
        return "-" if v is None else format(v, fmt) + suffix

    for r in rows:
        bound = f(r["bound_ms"], ".4f") + ("" if r["bound_by"] is None else f" ({r['bound_by']})")
        t.add_row(r["stage"], f(r["ours_ms"], ".4f"), f(r["baseline_ms"], ".4f"), f(r["ratio"], ".2f", "x"),
                  f(r.get("ours_graph_ms"), ".4f"), f(r.get("baseline_graph_ms"), ".4f"),
                  f(r.get("graph_ratio"), ".2f", "x"), bound, f(r["pct_of_bound"], ".0f", "%"))
    return t


def account_for(label: str, s: LayerShape, rows: list[dict[str, Any]], elem_bytes: int, copy_gbps: float,
                gemm_tflops: float, family: str = "layer") -> list[dict[str, Any]]:
    """The account rows of one model shape from the benchmark rows of `label` (`--json-out` rows:
    family "layer-account" or "module-account", model, shape and the rates beside each
    `account_rows` row).
    family "module": the step is mamba-ssm's Mamba2 module's training step on its fused path."""
    step = MODULE_STEP if family == "module" else LAYER_STEP
    return [{"family": f"{family}-account", "model": label, "shape": s.text(), "copy_gbps": copy_gbps,
             "gemm_tflops": gemm_tflops, **r}
            for r in account_rows(s, elem_bytes, times_of(rows, label), copy_gbps, gemm_tflops, step,
                                  times_of(rows, label, ("ours_graph_ms", "baseline_graph_ms")))]


def is_account(row: dict[str, Any]) -> bool:
    """Whether a benchmark row is one of the account's."""
    return str(row.get("family", "")).endswith("-account")
