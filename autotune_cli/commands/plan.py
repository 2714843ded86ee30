"""`mamba-tune plan SPEC`: the combos a sweep would tune, with a time estimate (no GPU)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune_cli.commands.common import Command, err, fail, out


def plan_command(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Sweep spec (YAML).", exists=True, dir_okay=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON on stdout.")] = False,
    gpus: Annotated[int, typer.Option(metavar="N", help="GPUs the sweep will spread over (for the estimate).", min=1)] = 1,
    shipped: Annotated[bool, typer.Option("--shipped", help="Only the part of the sweep the spec's `shipped` "
                                          "section names for the --gpu SKU (what its committed bundle holds).")] = False,
    gpu: Annotated[str | None, typer.Option(metavar="SKU", help="Plan for this GPU SKU, one of the spec target's arch "
                                            "(default: the spec's target GPU).")] = None,
) -> None:
    """List the exact, de-duplicated (kernel, shape, dtype) combos of SPEC and estimate the time."""
    from autotune_cli.plan import estimate_seconds_for, plan
    from autotune_cli.spec import SpecError, load_spec

    try:
        spec = load_spec(spec_path, shipped=shipped, gpu=gpu)
    except SpecError as e:
        fail(str(e))
    combos = plan(spec)
    per = estimate_seconds_for(spec.budget)
    total = per * len(combos) / gpus
    if as_json:
        out.print_json(json.dumps({
            "spec": spec.name, "sha256": spec.sha256, "target": spec.target.model_dump(),
            "budget": spec.budget.model_dump(), "estimate_seconds_per_combo": per,
            "estimate_seconds_total": total, "gpus": gpus,
            "combos": [{"key": c.key, "kernel": c.kernel, "dims": c.dims, "dtype": c.dtype, "origins": list(c.origins)}
                       for c in combos],
        }))
        return
    part = " (shipped part)" if shipped else ""
    table = Table(title=f"{escape(spec.name)}{part}: {len(combos)} combos for {spec.target.gpu}")
    for col in ("#", "kernel", "dims", "dtype", "from"):
        table.add_column(col, overflow="fold")
    for i, c in enumerate(combos, 1):
        table.add_row(*map(Text, (str(i), c.kernel, ",".join(f"{k}={v}" for k, v in c.dims.items()), c.dtype,
                                  "; ".join(c.origins))))
    out.print(table)
    b = spec.budget
    out.print(f"budget: effort {b.effort}, {b.algorithm}, seed {b.seed}"
              + (f", {b.seconds_per_combo} s per combo" if b.seconds_per_combo else ""))
    h, m = divmod(int(total) // 60, 60)
    out.print(f"estimate: about {per / 60:.1f} min per combo, {h}h{m:02d}m in all on {gpus} GPU(s)")
    run = f"mamba-tune sweep {spec_path}" + (" --shipped" if shipped else "")
    if gpu is not None and gpu != load_spec(spec_path).target.gpu:
        run += " --allow-gpu-mismatch"  # the spec targets another SKU of this arch
    err.print(f"run it on a {spec.target.gpu} machine with: {run}", markup=False)


def register(app: typer.Typer) -> None:
    app.command("plan", cls=Command)(plan_command)
