"""`mamba-tune sweep SPEC` and `mamba-tune tune KERNEL`: run the Helion autotuner, write bundles."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune_cli.commands.common import (
    EXIT_CHECK_FAILED,
    Command,
    DtypeChoice,
    EffortChoice,
    err,
    fail,
    os_error_text,
    out,
)
from autotune_cli.kernel_keys import all_keys
from autotune_cli.presets import SEARCH_ALGORITHMS

if TYPE_CHECKING:
    from autotune_cli.sweep import Sweep, SweepResult

DEFAULT_OUT = Path("generated_configs")


def _parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        gpus = [int(g) for g in text.split(",") if g.strip()]
    except ValueError:
        fail(f"--gpus {text!r}: expected a comma-separated list of GPU indices, e.g. 0,1")
    if not gpus or len(set(gpus)) != len(gpus):
        fail(f"--gpus {text!r}: expected distinct GPU indices, e.g. 0,1")
    return gpus


def _summary(result: SweepResult) -> None:
    table = Table(title=f"sweep summary: {escape(str(result.bundle_path))}")
    for col in ("kernel", "dims", "dtype", "status", "tuned ms", "vs default", "vs baseline"):
        table.add_column(col, overflow="fold")
    for r in result.results:
        dims = ",".join(f"{k}={v}" for k, v in r.combo.dims.items())
        if r.entry is not None:
            e = r.entry
            status = "kept" if r.skipped else "tuned"
            vb = f"{e.speedup.vs_baseline:.2f}x" if e.speedup.vs_baseline is not None else "-"
            table.add_row(*map(Text, (r.combo.kernel, dims, r.combo.dtype, status, f"{e.timing.tuned_ms:.4f}",
                                      f"{e.speedup.vs_default:.2f}x", vb)))
        else:
            reason = r.failure.reason if r.failure else "?"
            # Plain text: a failure reason may hold '[...]' (an error message, a path).
            table.add_row(*map(Text, (r.combo.kernel, dims, r.combo.dtype, f"FAILED: {reason}", "-", "-", "-")))
    out.print(table)


def _run(sweep: Sweep) -> None:
    from autotune_cli.sweep import SweepInputError, SweepTerminated

    try:
        result = sweep.run()
    except SweepInputError as e:
        fail(str(e))
    except SweepTerminated as e:
        if not e.reported:
            err.print(f"[yellow]terminated by {e.name}")
        raise typer.Exit(e.exit_code) from None
    except OSError as e:
        # Every finished combo is already in the bundle (each one is written atomically).
        where = os_error_text(e) if e.filename else f"under {sweep.opt.out_dir}: {e.strerror or e}"
        fail(f"cannot write {where} (combos finished before it are kept in the bundle)")
    _summary(result)
    if result.failed:
        err.print(f"[red]{len(result.failed)} combo(s) failed; reasons are recorded under 'failures' in "
                  f"{escape(str(result.bundle_path))}")
        raise typer.Exit(EXIT_CHECK_FAILED)


GpusOpt = Annotated[str | None, typer.Option(metavar="IDS", help="GPU indices to spread the work over, e.g. 0,1 (default: all).")]
OutOpt = Annotated[Path, typer.Option("-o", "--out", metavar="DIR", help="Bundle root; the bundle is DIR/SKU/NAME.json (SKU: this "
                                                                   "GPU's, e.g. h200; cpu for --cpu-dry-run).",
                                      file_okay=False)]
ForceOpt = Annotated[bool, typer.Option(help="Re-tune combos that are already in the bundle.")]
MismatchOpt = Annotated[bool, typer.Option(help="Tune even if this GPU is not the spec's target.")]
DryOpt = Annotated[bool, typer.Option(
    help="No GPU: run the pipeline in Helion ref mode with default configs (no search) into "
         "DIR/cpu/; for checking a spec end to end, never for real bundles.")]
LogOpt = Annotated[Path, typer.Option(metavar="DIR", help="Folder for per-combo worker logs.", file_okay=False)]
TimeoutOpt = Annotated[float | None, typer.Option(metavar="SECONDS", help="Kill a combo's worker after this many seconds "
                                                       "(default: 2 x the search budget + 10 min).", min=1)]


def sweep_command(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Sweep spec (YAML).", exists=True, dir_okay=False)],
    out_dir: OutOpt = DEFAULT_OUT,
    force: ForceOpt = False,
    gpus: GpusOpt = None,
    allow_gpu_mismatch: MismatchOpt = False,
    cpu_dry_run: DryOpt = False,
    log_dir: LogOpt = Path(".mamba-tune/logs"),
    timeout: TimeoutOpt = None,
    kernel: Annotated[list[str] | None, typer.Option(metavar="KERNEL", 
        help="Only these kernels of the spec (repeatable); the rest stay as they are in the bundle.")] = None,
    seconds_per_combo: Annotated[int | None, typer.Option(metavar="SECONDS", 
        min=1, help="Override the spec's search budget per combo (each entry records the budget it got).")] = None,
    origin: Annotated[list[str] | None, typer.Option(metavar="TEXT", 
        help="Only combos whose origin (as `plan` prints it, e.g. 'tp=1 batch=2 seqlen=8192') contains this "
             "text (repeatable: any of them); the rest stay as they are in the bundle.")] = None,
) -> None:
    """Tune every combo of SPEC on this machine's GPUs and write the bundle (resumable)."""
    from autotune_cli.plan import plan
    from autotune_cli.spec import SpecError, load_spec
    from autotune_cli.sweep import Sweep, SweepOptions  # torch and helion: only when a sweep runs
    from kernels.bundle import SpecRef

    try:
        spec = load_spec(spec_path)
    except SpecError as e:
        fail(str(e))
    combos = plan(spec)
    if kernel:
        unknown = sorted(set(kernel) - set(spec.kernels))
        if unknown:
            fail(f"--kernel {', '.join(unknown)}: not in the spec's kernels ({', '.join(spec.kernels)})")
        combos = [c for c in combos if c.kernel in kernel]
    if origin:
        combos = [c for c in combos if any(o in text for o in origin for text in c.origins)]
        if not combos:
            fail(f"--origin {' | '.join(origin)}: no combo of {spec_path} comes from it (see `mamba-tune plan`)")
    budget = spec.budget
    if seconds_per_combo is not None:
        budget = budget.model_copy(update={"seconds_per_combo": seconds_per_combo})
    if cpu_dry_run and budget.effort != "none":
        err.print("cpu dry run: no search (effort none), default configs only")
        budget = budget.model_copy(update={"effort": "none"})
    sweep = Sweep(
        combos, budget=budget, tolerances=spec.tolerances, target_sku=spec.target.gpu, bundle_name=spec.name,
        spec_ref=SpecRef(name=spec.name, path=str(spec_path), sha256=spec.sha256),
        options=SweepOptions(out_dir=out_dir, force=force, gpus=_parse_gpus(gpus),
                             allow_gpu_mismatch=allow_gpu_mismatch, cpu_dry_run=cpu_dry_run, log_dir=log_dir,
                             timeout_s=timeout, partial=bool(kernel or origin)),
        console=err,
    )
    _run(sweep)


def _parse_dims(text: str, kernel: str) -> dict[str, int]:
    tk = all_keys()[kernel]
    dims: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            fail(f"--dims: {item!r} is not NAME=INT")
        if name not in tk.dims:
            fail(f"--dims: {kernel} has no dim {name!r}; its dims are {', '.join(tk.dims)}")
        try:
            dims[name] = int(value)
        except ValueError:
            fail(f"--dims: {name}={value!r} is not an integer")
    missing = [d for d in tk.dims if d not in dims]
    if missing:
        fail(f"--dims: missing {', '.join(missing)} for {kernel} (needs {', '.join(tk.dims)})")
    return {d: dims[d] for d in tk.dims}


def tune_command(
    kernel: Annotated[str, typer.Argument(metavar="KERNEL", help="Kernel name (see `mamba-tune plan` or the README).")],
    dims: Annotated[str, typer.Option(metavar="K=V,...", help="The key dims, e.g. rows=16384,d=4096,... (all of the kernel's dims).")],
    dtype: Annotated[DtypeChoice, typer.Option(metavar="bf16|fp16|fp32", help="Input dtype.")] = DtypeChoice.bf16,
    gpu: Annotated[str, typer.Option(metavar="SKU", help="Target GPU SKU (must match this GPU unless --allow-gpu-mismatch).")] = "h200",
    effort: Annotated[EffortChoice, typer.Option(metavar="none|quick|full", help="Helion autotune effort.")] = EffortChoice.quick,
    seconds: Annotated[int | None, typer.Option(metavar="SECONDS", help="Cap on the search's wall time, seconds.", min=1)] = None,
    algorithm: Annotated[str, typer.Option(metavar="NAME", help=f"Search algorithm: {', '.join(SEARCH_ALGORITHMS)}.")] = "LFBOTreeSearch",
    seed: Annotated[int, typer.Option(metavar="SEED", help="Autotuner random seed.", min=0)] = 0,
    name: Annotated[str, typer.Option(metavar="NAME", help="Bundle name, DIR/SKU/NAME.json: 1-100 of "
                                                          "A-Z a-z 0-9 . _ -, starting with a letter or digit.")] = "adhoc",
    out_dir: OutOpt = DEFAULT_OUT,
    force: ForceOpt = False,
    allow_gpu_mismatch: MismatchOpt = False,
    cpu_dry_run: DryOpt = False,
    log_dir: LogOpt = Path(".mamba-tune/logs"),
    timeout: TimeoutOpt = None,
) -> None:
    """Tune one kernel at one shape (what a runtime warning about a missing config asks for)."""
    from autotune_cli.plan import Combo
    from autotune_cli.presets import GPU_SKUS
    from autotune_cli.spec import DEFAULT_TOLERANCES, Budget, dims_problem, name_problem
    from autotune_cli.sweep import Sweep, SweepOptions  # torch and helion: only when a sweep runs

    known = all_keys()
    if kernel not in known:
        fail(f"unknown kernel {kernel!r}; known: {', '.join(known)}")
    if gpu not in GPU_SKUS:
        fail(f"--gpu {gpu!r}: unknown GPU; known: {', '.join(GPU_SKUS)}")
    if algorithm not in SEARCH_ALGORITHMS:
        fail(f"--algorithm {algorithm!r}: one of {', '.join(SEARCH_ALGORITHMS)}")
    if why := name_problem(name):
        fail(f"--name {why}")
    parsed = _parse_dims(dims, kernel)
    if why := dims_problem(parsed):
        fail(f"--dims: {why}")
    budget = Budget(effort="none" if cpu_dry_run else effort.value, seconds_per_combo=seconds, algorithm=algorithm,
                    seed=seed)
    combo = Combo(kernel=kernel, dims=parsed, dtype=dtype.value, origins=("mamba-tune tune",))
    sweep = Sweep(
        [combo], budget=budget, tolerances=DEFAULT_TOLERANCES, target_sku=gpu, bundle_name=name, spec_ref=None,
        options=SweepOptions(out_dir=out_dir, force=force, allow_gpu_mismatch=allow_gpu_mismatch,
                             cpu_dry_run=cpu_dry_run, log_dir=log_dir, timeout_s=timeout),
        console=err,
    )
    _run(sweep)


def register(app: typer.Typer) -> None:
    app.command("sweep", cls=Command)(sweep_command)
    app.command("tune", cls=Command)(tune_command)
