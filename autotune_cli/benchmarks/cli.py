"""`mamba-tune bench`: ours (tuned configs from the bundles) vs mamba-ssm on this GPU."""

from __future__ import annotations

import enum
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from autotune_cli.commands.common import DtypeChoice, err, fail, out
from autotune_cli.presets import BENCH_SEQLEN, MODEL_PRESETS, bench_batch
from mamba_tune.keys import ModelShape
from mamba_tune.vocab import torch_dtype as to_torch_dtype

# --config-mode's choices: mamba_tune.runtime.Mode's values (not imported: mamba_tune.runtime loads
# torch, and `mamba-tune --help` builds every command's options).
ConfigMode = enum.Enum("ConfigMode", {m: m for m in ("exact", "nearest", "default")}, type=str)


class Family(str, enum.Enum):
    norm = "norm"
    ssd = "ssd"
    layer = "layer"
    module = "module"
    model = "model"
    all = "all"


def _shapes(models: list[str], tp: int, batch: int, seqlen: int) -> list[tuple[str, ModelShape]]:
    shapes = []
    for name in models:
        if name not in MODEL_PRESETS:
            fail(f"--model {name!r}: unknown preset; known: {', '.join(MODEL_PRESETS)}")
        m = MODEL_PRESETS[name]
        if m.nheads % tp or m.ngroups % tp:
            fail(f"--tp {tp} does not divide {name}'s nheads {m.nheads} and ngroups {m.ngroups}")
        label = name + (f" tp{tp}" if tp > 1 else "")
        shapes.append((label, ModelShape(batch=batch, seqlen=seqlen, nheads=m.nheads // tp, headdim=m.headdim,
                                         ngroups=m.ngroups // tp, dstate=m.dstate, chunk_size=m.chunk_size)))
    return shapes


def _layer_shapes(models: list[str], tps: list[int], batch: int, seqlen: int) -> list[tuple[str, Any]]:
    """(label, LayerShape) for each tp and model, in `_shapes`' order (checked there)."""
    from autotune_cli.benchmarks.layer import layer_shape

    return [(name + (f" tp{t}" if t > 1 else ""), layer_shape(MODEL_PRESETS[name], t, batch, seqlen))
            for t in tps for name in models]


def _model_shapes(models: list[str], tps: list[int], batch: int, seqlen: int, pattern: str) -> list[tuple[str, Any]]:
    """(label, benchmarks.model.ModelShape) for each tp and model, in `_shapes`' order; one-line errors."""
    from autotune_cli.benchmarks.model import PATTERN, model_shape

    out = []
    for t in tps:
        for name in models:
            try:
                s = model_shape(name, t, batch, seqlen, pattern)
            except ValueError as e:
                fail(f"--family model: {e}")
            out.append((name + (f" tp{t}" if t > 1 else "") + ("" if pattern == PATTERN else f" {pattern}"), s))
    return out


def bench_command(
    family: Annotated[Family, typer.Option(metavar="norm|ssd|layer|module|model|all", help="Which kernels to time (layer: one whole Mamba-2 layer, forward and backward, and its stages; module: mamba-ssm's Mamba2 module patched vs unpatched; model: transformers' NemotronH training step patched vs unpatched; module and model are not part of all).")] = Family.norm,
    model: Annotated[list[str] | None, typer.Option(metavar="PRESET", help="Model preset (repeatable; default: every preset, with --family model the hybrid ones).")] = None,
    tp: Annotated[list[int] | None, typer.Option(metavar="N", help="Tensor-parallel degree (repeatable; default 1).")] = None,
    batch: Annotated[int | None, typer.Option(metavar="N", help="Batch size (default 2; 1 with --family model).", min=1)] = None,
    seqlen: Annotated[int, typer.Option(metavar="N", help="Sequence length.", min=1)] = BENCH_SEQLEN,
    dtype: Annotated[DtypeChoice, typer.Option(metavar="bf16|fp16|fp32", help="Input dtype.")] = DtypeChoice.bf16,
    json_out: Annotated[Path | None, typer.Option(metavar="FILE", help="Also write the rows, machine and versions as JSON.",
                                                  dir_okay=False)] = None,
    ssd_stage: Annotated[list[str] | None, typer.Option(metavar="STAGE", 
        help="SSD rows to time (repeatable; default: all). E.g. total, total_wall, total_seq_idx, bmm.")] = None,
    layer_stage: Annotated[list[str] | None, typer.Option(metavar="STAGE",
        help="Layer rows to time (repeatable; default: all). E.g. layer_fwd_bwd, layer_fwd, ssd_bwd.")] = None,
    module_stage: Annotated[list[str] | None, typer.Option(metavar="STAGE",
        help="Module rows to time (repeatable; default: all). E.g. module_fwd_mem_eff, module_train_step_unfused.")] = None,
    model_stage: Annotated[list[str] | None, typer.Option(metavar="STAGE",
        help="Model rows to time (repeatable; default: all): model_train_step, model_train_step_wall.")] = None,
    pattern: Annotated[str | None, typer.Option(metavar="LAYERS",
        help="With --family model: the layers, one character each (M: Mamba-2, *: attention, -: MLP; "
             "default M-M-M-M*-, Nemotron-H 8B's first 9).")] = None,
    account: Annotated[bool, typer.Option("--account",
        help="With --family layer or module: the training step's account, each stage of the forward and "
             "backward on both sides against its bound (bytes at the measured copy bandwidth or FLOPs at "
             "a measured GEMM's rate), what is left (launch gaps, host time) and the non-GEMM total; "
             "times only the rows it needs unless --layer-stage / --module-stage add others.")] = False,
    config_mode: Annotated[ConfigMode | None, typer.Option(metavar="exact|nearest|default", 
        help="Config lookup: exact, nearest (the default) or default (the kernels' default configs).")] = None,
) -> None:
    """Time ours vs mamba-ssm in the same process (do_bench medians, L2 flushed) and print ratios."""
    from autotune_cli.benchmarks.common import LAYER_STAGES, MODEL_STAGES, MODULE_STAGES, SSD_STAGES

    bad = sorted(set(ssd_stage or ()) - set(SSD_STAGES))
    if bad:
        fail(f"--ssd-stage {bad[0]!r}: unknown; known: {', '.join(SSD_STAGES)}")
    if ssd_stage and family not in (Family.ssd, Family.all):
        fail("--ssd-stage: only with --family ssd or all")
    bad = sorted(set(layer_stage or ()) - set(LAYER_STAGES))
    if bad:
        fail(f"--layer-stage {bad[0]!r}: unknown; known: {', '.join(LAYER_STAGES)}")
    if layer_stage and family not in (Family.layer, Family.all):
        fail("--layer-stage: only with --family layer or all")
    bad = sorted(set(module_stage or ()) - set(MODULE_STAGES))
    if bad:
        fail(f"--module-stage {bad[0]!r}: unknown; known: {', '.join(MODULE_STAGES)}")
    if module_stage and family is not Family.module:
        fail("--module-stage: only with --family module")
    if account and family not in (Family.layer, Family.module):
        fail("--account: only with --family layer or module")
    bad = sorted(set(model_stage or ()) - set(MODEL_STAGES))
    if bad:
        fail(f"--model-stage {bad[0]!r}: unknown; known: {', '.join(MODEL_STAGES)}")
    if (model_stage or pattern is not None) and family is not Family.model:
        fail(f"{'--model-stage' if model_stage else '--pattern'}: only with --family model")
    if batch is None:
        batch = bench_batch(family.value)
    if family is Family.model:
        from autotune_cli.benchmarks.model import HYBRID_DIMS, PATTERN

        models = model or list(HYBRID_DIMS)
    else:
        models = model or list(MODEL_PRESETS)
    shapes = [s for t in (tp or [1]) for s in _shapes(models, t, batch, seqlen)]
    if family is Family.model:
        layer_shapes = _model_shapes(models, tp or [1], batch, seqlen, PATTERN if pattern is None else pattern)
    elif family in (Family.layer, Family.module, Family.all):
        layer_shapes = _layer_shapes(models, tp or [1], batch, seqlen)
    else:
        layer_shapes = [None] * len(shapes)
    import torch

    if not torch.cuda.is_available():
        fail("no CUDA GPU on this machine: `mamba-tune bench` times kernels on the GPU")
    from autotune_cli.benchmarks.common import copy_gbps, gemm_tflops, machine_line
    from mamba_tune import runtime

    if config_mode is not None:
        runtime.configure(mode=config_mode.value)
        if runtime.current_mode().value != config_mode.value:
            fail(f"--config-mode {config_mode.value}: {runtime.ENV_MODE}={runtime.current_mode().value} "
                 "in the environment overrides it; unset one")
    from autotune_cli.environment import now

    torch_dtype = to_torch_dtype(dtype.value)
    line = machine_line()
    copy = copy_gbps()
    err.print(f"{line}; device-to-device copy {copy:.0f} GB/s")
    header: dict[str, Any] = {"machine": line, "copy_gbps": copy, "time": now(), "batch": batch, "seqlen": seqlen,
                              "dtype": dtype.value, "config_mode": runtime.current_mode().value}
    rows: list[dict[str, Any]] = []
    from autotune_cli.benchmarks.norm import bench_norm, lookup_us

    if family in (Family.ssd, Family.all):
        try:
            from autotune_cli.benchmarks.ssd import bench_ssd
        except ImportError as e:
            fail(f"the SSD benchmark is not available: {e}")
    if family in (Family.layer, Family.all):
        try:
            from autotune_cli.benchmarks.layer import bench_layer
        except ImportError as e:
            fail(f"the layer benchmark is not available: {e}")
    if family is Family.module:
        try:
            import mamba_ssm.modules.mamba2  # noqa: F401  (the module it times)

            import mamba_tune
            from autotune_cli.benchmarks.module import bench_module
        except ImportError as e:
            fail(f"the module benchmark needs mamba-ssm's Mamba2: {e}")
        if mamba_tune.is_patched():
            fail("--family module: mamba-ssm is patched already (MAMBA_TUNE_PATCH_MAMBA_SSM?): "
                 "the baseline would run mamba-tune's kernels; unset it")
    if family is Family.model:
        try:
            import transformers.models.nemotron_h.modeling_nemotron_h  # noqa: F401  (the model it times)

            import mamba_tune
            from autotune_cli.benchmarks.model import bench_model
        except ImportError as e:
            fail(f"the model benchmark needs transformers' NemotronH: {e}")
        if mamba_tune.is_transformers_patched() or mamba_tune.is_patched():
            fail("--family model: transformers or mamba-ssm is patched already (MAMBA_TUNE_PATCH_TRANSFORMERS, "
                 "MAMBA_TUNE_PATCH_MAMBA_SSM?): the baseline would run mamba-tune's kernels; unset them")
        header["pattern"] = layer_shapes[0][1].pattern
    from autotune_cli.benchmarks import account as acc

    layer_rows = (list(layer_stage or ()) + [*acc.STAGE_ROWS, *acc.LAYER_STEP] if account
                  else layer_stage or LAYER_STAGES)
    layer_rows = [s for s in LAYER_STAGES if s in layer_rows]
    module_rows = list(module_stage or ()) + list(acc.MODULE_STEP) if account else module_stage or MODULE_STAGES
    module_rows = [s for s in MODULE_STAGES if s in module_rows]
    if account and family is Family.module:
        try:
            from autotune_cli.benchmarks.layer import bench_layer
        except ImportError as e:
            fail(f"the layer benchmark is not available: {e}")
    t0 = time.monotonic()
    # One model shape at a time, with the JSON rewritten after each: a run stopped part way
    # (a device time limit) keeps what it measured, marked "complete": false.
    for i, (shape, lshape) in enumerate(zip(shapes, layer_shapes, strict=True), 1):
        # Said before the first shape: compiling both sides' kernels can take minutes, silently.
        err.print(f"[{i}/{len(shapes)}] {shape[0]} started; elapsed {time.monotonic() - t0:.0f} s"
                  + (" (the first calls compile every kernel: a minute or more in a fresh process)" if i == 1 else ""))
        if family in (Family.norm, Family.all):
            rows += bench_norm([shape], torch_dtype)
        if family in (Family.ssd, Family.all):
            rows += bench_ssd([shape], torch_dtype, 200, stages=ssd_stage or SSD_STAGES)
        if family in (Family.layer, Family.all):
            rows += bench_layer([lshape], torch_dtype, 200, stages=layer_rows)
        if family is Family.module:
            rows += bench_module([lshape], torch_dtype, 200, stages=module_rows)
            if account:  # the stages, timed as the layer benchmark times them
                rows += bench_layer([lshape], torch_dtype, 200, stages=acc.STAGE_ROWS)
        if family is Family.model:
            new = bench_model([lshape], torch_dtype, stages=model_stage or MODEL_STAGES)
            rows += new
            r = new[0]
            err.print(f"{lshape[0]}: loss ours {r['ours_loss']:.6f}, {r['baseline']} {r['baseline_loss']:.6f} "
                      f"(differ by {r['loss_abs_diff']:.2e}, tolerance {r['loss_tol']:.2e}); gradients' max "
                      f"relative difference {r['grad_max_rel_diff']:.2e}")
        if account:
            tokens = lshape[1].batch * lshape[1].seqlen
            rows += acc.account_for(lshape[0], lshape[1], [r for r in rows if not acc.is_account(r)],
                                    torch_dtype.itemsize, copy, gemm_tflops(tokens, dtype=torch_dtype), family.value)
        err.print(f"[{i}/{len(shapes)}] {shape[0]} done; elapsed {time.monotonic() - t0:.0f} s")
        if json_out is not None:
            write_results(json_out, header, rows, complete=False)
    if family in (Family.norm, Family.all):
        header["lookup_us"] = lookup_us()
        err.print(f"runtime config lookup after the first call: {header['lookup_us']:.2f} us")
    table = Table(title=f"ours vs {'transformers' if family is Family.model else 'mamba-ssm'}, batch {batch}, "
                        f"seqlen {seqlen}, {dtype.value}")
    cols = ("model", "op", "shape", "ours ms", "ours GB/s", "mamba-ssm ms", "mamba-ssm GB/s", "speedup",
            "ours wall ms", "mamba-ssm wall ms", "ours graph ms", "mamba-ssm graph ms", "config")
    for c in cols:
        table.add_column(c, overflow="fold")

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    for r in rows:
        if acc.is_account(r):
            continue
        table.add_row(r.get("model", ""), r.get("op", r.get("stage", "")), r.get("shape", ""),
                      f(r.get("ours_ms"), ".4f"), f(r.get("ours_gbps"), ".0f"), f(r.get("baseline_ms"), ".4f"),
                      f(r.get("baseline_gbps"), ".0f"),
                      f(r.get("speedup", r.get("ratio")), ".2f") + ("x" if r.get("speedup", r.get("ratio")) else ""),
                      f(r.get("ours_wall_ms"), ".4f"), f(r.get("baseline_wall_ms"), ".4f"),
                      f(r.get("ours_graph_ms"), ".4f"), f(r.get("baseline_graph_ms"), ".4f"), str(r.get("config", "")))
    out.print(table)
    if account:
        for label, lshape in layer_shapes:
            mine = [r for r in rows if acc.is_account(r) and r["model"] == label]
            if mine:
                out.print(acc.table(f"{label}: the {family.value} training step's account ({lshape.text()}, "
                                    f"{dtype.value}; copy {copy:.0f} GB/s, GEMM {mine[0]['gemm_tflops']:.0f} "
                                    "TFLOP/s)", mine))
    if json_out is not None:
        write_results(json_out, header, rows, complete=True)
        err.print(f"wrote {json_out}")


def write_results(path: Path, header: dict[str, Any], rows: list[dict[str, Any]], complete: bool) -> None:
    """Write the benchmark JSON atomically (a reader never sees half a file)."""
    from mamba_tune.bundle import write_text_atomic

    write_text_atomic(path, json.dumps({**header, "complete": complete, "rows": rows}, indent=2))
