"""`mamba-tune sweep SPEC` and `mamba-tune tune KERNEL`: run the Helion autotuner, write bundles."""

from __future__ import annotations

import dataclasses
import enum
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
from autotune_cli.presets import SEARCH_ALGORITHMS
from mamba_tune.keys import all_keys

if TYPE_CHECKING:
    from autotune_cli.plan import Combo
    from autotune_cli.spec import Budget, Spec, Tolerance
    from autotune_cli.sweep_job import SweepJob, SweepResult
    from mamba_tune.bundle import SpecRef

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


def _run(job: SweepJob) -> None:
    """The local executor on `job`; its summary, exit code 1 where a combo failed."""
    from autotune_cli.sweep import Sweep, SweepTerminated
    from autotune_cli.sweep_job import SweepInputError

    try:
        result = Sweep(job, console=err).run()
    except SweepInputError as e:
        fail(str(e))
    except SweepTerminated as e:
        if not e.reported:
            err.print(f"[yellow]terminated by {e.name}")
        raise typer.Exit(e.exit_code) from None
    except OSError as e:
        # Every finished combo is already in the bundle (each one is written atomically).
        where = os_error_text(e) if e.filename else f"under {job.options.out_dir}: {e.strerror or e}"
        fail(f"cannot write {where} (combos finished before it are kept in the bundle)")
    _finish(result)


def _finish(result: SweepResult) -> None:
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
         "DIR/cpu/; for checking a spec end to end, never for real bundles. A model too big for a CPU "
         "runs at shrunk dims (the same kernels, options and dtypes; printed).")]
WarmOpt = Annotated[list[Path] | None, typer.Option(
    metavar="BUNDLE", dir_okay=False,
    help="Also start each search from the configs that this bundle (tuned on this GPU SKU or a sibling of its arch) holds for the "
         "same key or the nearest shapes of the same kernel (repeatable); the bundle being written always counts.")]
AdoptOpt = Annotated[bool, typer.Option(
    "--adopt-sibling", help="With --warm-start SIBLING.json (a bundle of another SKU of this GPU's arch, e.g. h200 "
                            "for an h100): a combo whose key it holds, fresh, is not searched: its config is checked "
                            "against fp32 and timed here, and kept unless it fails or is slower than the default "
                            "config (then the combo is searched). The entry records `adopted_from`.")]
LogOpt = Annotated[Path, typer.Option(metavar="DIR", help="Folder for per-combo worker logs.", file_okay=False)]
FreshOpt = Annotated[bool, typer.Option(
    "--fresh-workers", help="local: a new worker process per combo, instead of one per GPU kept warm between combos "
                            "(which imports torch, helion and the kernels once).")]


class Executor(str, enum.Enum):
    local = "local"
    slurm = "slurm"


ExecutorOpt = Annotated[Executor, typer.Option(
    metavar="local|slurm",
    help="local: workers on this machine's GPUs; slurm: one Slurm job array (see docs/cluster.md).")]
TimeoutOpt = Annotated[float | None, typer.Option(metavar="SECONDS", help="Kill a combo's worker after this many seconds "
                                                       "(default: 2 x the search budget + 10 min).", min=1)]


@dataclasses.dataclass(frozen=True)
class _Source:
    """What a sweep's combos come from: a spec, or a call record."""

    kernels: list[str]
    budget: Budget
    tolerances: dict[str, Tolerance]
    target_sku: str
    bundle_name: str
    spec_ref: SpecRef | None
    where: str
    what: str = "spec"


def _record_source(path: Path, *, force: bool, gpu: str | None, name: str | None,
                   cpu_dry_run: bool) -> tuple[list[Combo], _Source]:
    """`--from-record`: the recorded combos without an exact entry, the target GPU and bundle name."""
    from autotune_cli.from_record import combos_from_record
    from autotune_cli.limits import name_problem
    from autotune_cli.spec import DEFAULT_TOLERANCES, Budget
    from mamba_tune.record import RecordError
    from mamba_tune.sku import GPU_SKUS

    bundle_name = name or path.stem
    if why := name_problem(bundle_name):
        fail(f"--name {why}" if name else f"{path}: the record's file stem {why}; name the bundle with --name")
    try:
        rp = combos_from_record(path, force=force)
    except RecordError as e:
        fail(str(e))
    if gpu is None:
        if len(rp.skus) > 1:
            fail(f"{path}: calls ran on several GPUs ({', '.join(rp.skus)}); pick the target with --gpu")
        if not rp.skus and not cpu_dry_run:
            fail(f"{path}: the calls ran on no GPU (a CPU record); name the target with --gpu")
        gpu = rp.skus[0] if rp.skus else "h200"
    if gpu not in GPU_SKUS:
        fail(f"--gpu {gpu!r}: unknown GPU; known: {', '.join(GPU_SKUS)}")
    err.print(f"{path}: {rp.recorded} recorded key(s), {rp.exact} served exactly; "
              f"{len(rp.combos)} to tune" + (" (--force: all)" if force else ""))
    if not rp.combos:
        out.print("nothing to tune: every recorded key has an exact entry (--force re-tunes them)")
        raise typer.Exit(0)
    return rp.combos, _Source(sorted(all_keys()), Budget(), DEFAULT_TOLERANCES, gpu, bundle_name, None,
                              str(path), "record")


def _shipped_sku(spec: Spec, gpus: str | None, allow_gpu_mismatch: bool, no_local_gpu: bool) -> str:
    """The SKU whose `shipped` part `sweep --shipped` tunes (`shipped.sweep_section`): the local GPU's
    when the spec names one for it (a Slurm array's or a dry run's GPU is the target's)."""
    from autotune_cli.shipped import sweep_section

    running = None
    if allow_gpu_mismatch and not no_local_gpu and set(spec.shipped_skus) - {spec.target.gpu}:
        from autotune_cli import environment as env  # torch

        first = (_parse_gpus(gpus) or [0])[0]
        if 0 <= first < env.cuda_device_count():  # else the sweep says what is wrong with --gpus
            running = env.gpu_info(first).sku
    sku = sweep_section(spec.target.gpu, spec.shipped_skus, running, allow_gpu_mismatch)
    if sku != spec.target.gpu:
        err.print(f"--shipped: the part {spec.path} names for {sku}, the GPU this sweep runs on", markup=False)
    return sku


def sweep_command(
    spec_path: Annotated[Path | None, typer.Argument(
        metavar="SPEC", help="Sweep spec (YAML); or give --from-record.", exists=True, dir_okay=False)] = None,
    from_record: Annotated[Path | None, typer.Option(
        metavar="FILE", help="Tune the kernel keys of a call record (mamba_tune.record_calls / MAMBA_TUNE_RECORD) that had no exact "
             "entry (all of them with --force) instead of a spec's.", dir_okay=False)] = None,
    gpu: Annotated[str | None, typer.Option(
        metavar="SKU", help="With --from-record: target GPU SKU (default: the GPU the record's calls ran on).")] = None,
    name: Annotated[str | None, typer.Option(
        "--name", metavar="NAME", help="With --from-record: bundle name, DIR/SKU/NAME.json (default: the record file's stem).")] = None,
    out_dir: OutOpt = DEFAULT_OUT,
    force: ForceOpt = False,
    gpus: GpusOpt = None,
    allow_gpu_mismatch: MismatchOpt = False,
    cpu_dry_run: DryOpt = False,
    log_dir: LogOpt = Path(".mamba-tune/logs"),
    timeout: TimeoutOpt = None,
    kernel: Annotated[list[str] | None, typer.Option("--kernel", metavar="KERNEL",
        help="Only these kernels of the spec (repeatable); the rest stay as they are in the bundle.")] = None,
    seconds_per_combo: Annotated[int | None, typer.Option(metavar="SECONDS",
        min=1, help="Override the spec's search budget per combo (each entry records the budget it got).")] = None,
    origin: Annotated[list[str] | None, typer.Option(metavar="TEXT",
        help="Only combos whose origin (as `plan` prints it, e.g. 'tp=1 batch=2 seqlen=8192') contains this "
             "text (repeatable: any of them); the rest stay as they are in the bundle.")] = None,
    warm_start: WarmOpt = None,
    fresh_workers: FreshOpt = False,
    adopt_sibling: AdoptOpt = False,
    shipped: Annotated[bool, typer.Option("--shipped", help="Only the part of the sweep the spec's `shipped` "
                                          "section names (what the committed bundle holds): the target's part, or "
                                          "with --allow-gpu-mismatch that of the GPU it runs on if the spec names "
                                          "one.")] = False,
    executor: ExecutorOpt = Executor.local,
    slurm_partition: Annotated[str | None, typer.Option(metavar="NAME", help="slurm: the partition to submit to.")] = None,
    slurm_account: Annotated[str | None, typer.Option(metavar="NAME", help="slurm: the account to charge.")] = None,
    slurm_gpus_per_task: Annotated[int | None, typer.Option(
        metavar="N", min=0, help="slurm: GPUs per array task (default 1; 0 with --cpu-dry-run).")] = None,
    max_parallel: Annotated[int, typer.Option(
        metavar="N", min=1, help="slurm: at most this many array tasks run at once (the array's %N).")] = 64,
    slurm_extra: Annotated[list[str] | None, typer.Option(
        metavar="KEY=VALUE", help="slurm: an extra sbatch parameter KEY=VALUE, e.g. qos=high or cpus_per_task=16 (repeatable).")] = None,
    wait: Annotated[bool, typer.Option(
        help="slurm: wait for the array with progress; --no-wait submits, prints the job id and exits.")] = True,
) -> None:
    """Tune every combo of SPEC (or of a call record) on this machine's GPUs and write the bundle (resumable)."""
    # The spec first, torch-free: a bad spec is refused in a second, before torch and helion load.
    from autotune_cli.spec import SpecError, load_spec

    if (spec_path is None) == (from_record is None):
        fail("give a SPEC or --from-record FILE (exactly one)")
    if adopt_sibling and not warm_start:
        fail("--adopt-sibling needs --warm-start BUNDLE: the sibling SKU's bundle whose entries it adopts")
    if from_record is not None and shipped:
        fail("--shipped goes with a SPEC (its `shipped` section), not --from-record")
    spec: Spec | None = None
    if spec_path is not None:
        if gpu is not None or name is not None:
            fail("--gpu and --name go with --from-record; a spec names its target and bundle")
        try:
            spec = load_spec(spec_path)
            if shipped:
                spec = load_spec(spec_path, shipped=True, gpu=_shipped_sku(spec, gpus, allow_gpu_mismatch,
                                                                            cpu_dry_run or executor != Executor.local))
        except SpecError as e:
            fail(str(e))
    from autotune_cli.plan import plan, runs_for, short_timeout_warning
    from autotune_cli.sweep_job import SweepJob, SweepOptions  # torch and helion
    from mamba_tune.bundle import SpecRef

    if spec is None:
        assert from_record is not None
        combos, source = _record_source(from_record, force=force, gpu=gpu, name=name, cpu_dry_run=cpu_dry_run)
    else:
        if cpu_dry_run:
            from autotune_cli.dry_run import shrink_for_cpu

            spec, notes = shrink_for_cpu(spec)
            if notes:
                err.print("cpu dry run: dims shrunk so a CPU holds them (the same kernels, options and dtypes):",
                          markup=False)
            for line in notes:
                err.print(f"  {line}", markup=False)
        combos = plan(spec)
        source = _Source(spec.kernels, spec.budget, spec.tolerances, spec.target.gpu, spec.name,
                         SpecRef(name=spec.name, path=str(spec_path), sha256=spec.sha256), str(spec_path))
    if kernel:
        unknown = sorted(set(kernel) - set(source.kernels))
        if unknown:
            fail(f"--kernel {', '.join(unknown)}: not in the {source.what}'s kernels ({', '.join(source.kernels)})")
        combos = [c for c in combos if runs_for(c, kernel)]
    if origin:
        combos = [c for c in combos if any(o in text for o in origin for text in c.origins)]
        if not combos:
            fail(f"--origin {' | '.join(origin)}: no combo of {source.where} comes from it (see `mamba-tune plan`)")
    budget = source.budget
    if seconds_per_combo is not None:
        budget = budget.model_copy(update={"seconds_per_combo": seconds_per_combo})
    if cpu_dry_run and budget.effort != "none":
        err.print("cpu dry run: no search (effort none), default configs only")
        budget = budget.model_copy(update={"effort": "none"})
    warning = short_timeout_warning(timeout, budget)
    if warning:
        err.print(f"warning: {warning}", markup=False)
    # The one description of the sweep, whichever executor runs it.
    job = SweepJob(
        combos, budget=budget, tolerances=source.tolerances, target_sku=source.target_sku,
        bundle_name=source.bundle_name, spec_ref=source.spec_ref,
        options=SweepOptions(out_dir=out_dir, force=force, gpus=_parse_gpus(gpus),
                             allow_gpu_mismatch=allow_gpu_mismatch, cpu_dry_run=cpu_dry_run, log_dir=log_dir,
                             timeout_s=timeout, partial=bool(kernel or origin or from_record),
                             warm_start=tuple(warm_start or ()), fresh_workers=fresh_workers,
                             adopt_sibling=adopt_sibling),
    )
    if executor == Executor.slurm:
        from autotune_cli.commands.cluster import run_slurm

        result = run_slurm(job, partition=slurm_partition, account=slurm_account,
                           gpus_per_task=slurm_gpus_per_task, max_parallel=max_parallel, extra=slurm_extra or [],
                           wait=wait)
        if result is not None:  # None: --no-wait
            _finish(result)
        return
    _run(job)


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
    seconds: Annotated[int | None, typer.Option("--seconds", metavar="SECONDS", help="Cap on the search's wall time, seconds.", min=1)] = None,
    algorithm: Annotated[str, typer.Option(metavar="NAME", help=f"Search algorithm: {', '.join(SEARCH_ALGORITHMS)}.")] = "LFBOTreeSearch",
    seed: Annotated[int, typer.Option("--seed", metavar="SEED", help="Autotuner random seed.", min=0)] = 0,
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="Bundle name, DIR/SKU/NAME.json: 1-100 of "
                                                          "A-Z a-z 0-9 . _ -, starting with a letter or digit.")] = "adhoc",
    out_dir: OutOpt = DEFAULT_OUT,
    force: ForceOpt = False,
    allow_gpu_mismatch: MismatchOpt = False,
    cpu_dry_run: DryOpt = False,
    log_dir: LogOpt = Path(".mamba-tune/logs"),
    timeout: TimeoutOpt = None,
    warm_start: WarmOpt = None,
) -> None:
    """Tune one kernel at one shape (what a runtime warning about a missing config asks for)."""
    from autotune_cli.limits import dims_problem, name_problem
    from autotune_cli.plan import Combo
    from autotune_cli.spec import DEFAULT_TOLERANCES, Budget
    from autotune_cli.sweep_job import SweepJob, SweepOptions  # torch and helion
    from mamba_tune.sku import GPU_SKUS

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
    _run(SweepJob(
        [combo], budget=budget, tolerances=DEFAULT_TOLERANCES, target_sku=gpu, bundle_name=name, spec_ref=None,
        options=SweepOptions(out_dir=out_dir, force=force, allow_gpu_mismatch=allow_gpu_mismatch,
                             cpu_dry_run=cpu_dry_run, log_dir=log_dir, timeout_s=timeout,
                             warm_start=tuple(warm_start or ())),
    ))


def register(app: typer.Typer) -> None:
    app.command("sweep", cls=Command)(sweep_command)
    app.command("tune", cls=Command)(tune_command)
