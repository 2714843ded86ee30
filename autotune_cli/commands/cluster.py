"""`mamba-tune status`, `mamba-tune collect` (the Slurm executor's bookkeeping) and
`mamba-tune merge` (bundles from separate runs into one)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table

from autotune_cli.commands.common import Command, err, fail, os_error_text, out

if TYPE_CHECKING:
    from autotune_cli.sweep_job import SweepJob, SweepResult


def _parse_extra(items: list[str]) -> dict[str, str]:
    extra: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            fail(f"--slurm-extra {item!r}: expected KEY=VALUE, e.g. qos=high")
        extra[key.strip().lstrip("-")] = value
    return extra


def run_slurm(job: SweepJob, *, partition: str | None, account: str | None, gpus_per_task: int | None,
              max_parallel: int, extra: list[str], wait: bool) -> SweepResult | None:
    """`mamba-tune sweep --executor slurm`: submit, and by default wait (None with --no-wait)."""
    from autotune_cli.slurm import SlurmError, SlurmOptions, SlurmSweep
    from autotune_cli.sweep_job import SweepInputError

    if job.options.gpus is not None:
        fail("--gpus is for the local executor; with --executor slurm use --slurm-gpus-per-task")
    options = SlurmOptions(partition=partition, account=account, gpus_per_task=gpus_per_task,
                           max_parallel=max_parallel, extra=_parse_extra(extra), wait=wait)
    try:
        result = SlurmSweep(job, options, console=err).run()
    except (SweepInputError, SlurmError) as e:
        fail(str(e))
    return result if wait else None


PathArg = Annotated[Path, typer.Argument(
    metavar="BUNDLE", help="A bundle (DIR/SKU/NAME.json), its NAME.slurm folder, or a folder of bundles.")]


def status_command(path: PathArg) -> None:
    """What a Slurm sweep is doing: pending, running, done, failed per combo."""
    from autotune_cli.slurm import SlurmError, combo_statuses, find_slurm_dirs

    dirs = find_slurm_dirs(path)
    if not dirs:
        fail(f"{path}: no Slurm sweep state here (a <spec>.slurm folder next to the bundle)")
    for d in dirs:
        try:
            rows = combo_statuses(d)
        except SlurmError as e:
            fail(str(e))
        table = Table(title=str(d.with_suffix(".json")))
        for col in ("combo", "status", "job", "attempts", "detail"):
            table.add_column(col, overflow="fold")
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.status] = counts.get(r.status, 0) + 1
            table.add_row(escape(r.label), r.status, r.job_id, str(r.attempts), escape(r.detail))
        out.print(table)
        out.print(f"{d.with_suffix('.json')}: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())))


def collect_command(path: PathArg) -> None:
    """Merge finished Slurm results that are not in the bundle yet (a task killed after writing its result)."""
    from autotune_cli.slurm import collect, find_slurm_dirs

    dirs = find_slurm_dirs(path)
    if not dirs:
        fail(f"{path}: no Slurm sweep state here (a <spec>.slurm folder next to the bundle)")
    for d in dirs:
        merged = collect(d)
        for label, outcome in merged:
            out.print(f"{escape(label)}: {outcome['outcome']}" + (f" ({escape(outcome['reason'])})"
                                                                  if outcome.get("reason") else ""))
        out.print(f"{d.with_suffix('.json')}: merged {len(merged)} result(s)")


def merge_command(
    bundles: Annotated[list[Path], typer.Argument(metavar="BUNDLE", help="Bundles to merge.", exists=True,
                                                  dir_okay=False)],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="FILE", help="The merged bundle (written atomically).",
                                         dir_okay=False)],
    allow_mixed: Annotated[bool, typer.Option(
        help="Merge bundles of different GPU models or versions (the first one's provenance is kept).")] = False,
) -> None:
    """Merge bundles; a key in several keeps the fastest entry (same GPU and versions only)."""
    from autotune_cli.bundle_lock import BundleBusy, bundle_lock
    from autotune_cli.merge import MergeError, merge_bundles
    from mamba_tune.bundle import write_bundle

    try:
        merged, notes = merge_bundles(bundles, allow_mixed=allow_mixed)
    except MergeError as e:
        fail(str(e))
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        # The bundle's lock, as a sweep holds it: a sweep writing OUTPUT would drop the merge.
        with bundle_lock(output):
            write_bundle(merged, output)
    except BundleBusy as e:
        fail(f"-o {output}: {e}; merge when it is done, or into another file")
    except OSError as e:
        fail(f"cannot write {os_error_text(e)}")
    for line in notes:
        err.print(escape(line))
    out.print(f"wrote {escape(str(output))}: {len(merged.entries)} entries, {len(merged.failures)} failures "
              f"from {len(bundles)} bundles")


def register(app: typer.Typer) -> None:
    app.command("status", cls=Command)(status_command)
    app.command("collect", cls=Command)(collect_command)
    app.command("merge", cls=Command)(merge_command)
