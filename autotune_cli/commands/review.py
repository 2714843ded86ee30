"""`mamba-tune diff`, `check`, `verify`, `report` and `searches`: reviewing bundles in PRs and CI.

Exit codes: 0 ok; 1 the check failed (a regression over --fail-on-regression, a combo
missing or stale, an entry that fails verification); 2 bad input (unreadable or invalid
bundle or spec, unknown git revision, no CUDA GPU for verify, missing matplotlib).
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune_cli.commands.common import EXIT_CHECK_FAILED, Command, err, fail, os_error_text, out

if TYPE_CHECKING:
    from autotune_cli.review.verify import VerifyResult
    from mamba_tune.bundle import Entry


class OutputFormat(str, enum.Enum):
    table = "table"
    markdown = "markdown"
    json = "json"


FormatOpt = Annotated[OutputFormat, typer.Option("--format", "-f", metavar="table|markdown|json", help="table (terminal), markdown (a PR comment) "
                                                                        "or json (machines).")]


def _print_raw(text: str) -> None:
    # Markdown and JSON go out byte for byte: no rich markup, emoji codes or wrapping.
    typer.echo(text, nl=not text.endswith("\n"))


# --- diff -------------------------------------------------------------------------------


def diff_command(
    old: Annotated[str, typer.Argument(metavar="OLD", help="The old side: a bundle (.json), a folder of bundles, or a git "
                                            "REV:PATH such as main:generated_configs/h200.")],
    new: Annotated[str, typer.Argument(metavar="NEW", help="The new side, in the same forms (two files or two folders).")],
    fmt: FormatOpt = OutputFormat.table,
    fail_on_regression: Annotated[float | None, typer.Option(
        metavar="PCT", min=0.0,
        help="Exit 1 if an entry present on both sides got slower (tuned ms) by more than PCT percent, or lost "
             "more than PCT percent of its speedup vs the baseline.")] = None,
    missing_ok: Annotated[bool, typer.Option(
        help="Treat a side that does not exist (a path, or a path absent from the revision) as empty, e.g. "
             "main has no bundles for a new GPU SKU yet. Unknown revisions are still an error.")] = False,
) -> None:
    """Compare two bundles or bundle folders: entries, configs, timings, failures, provenance."""
    from autotune_cli.review import diff as d
    from autotune_cli.review.sources import SourceError, load_source

    try:
        a = load_source(old, missing_ok=missing_ok)
        b = load_source(new, missing_ok=missing_ok)
        result = d.diff_sets(a, b)
    except SourceError as e:
        fail(str(e))
    regs = None if fail_on_regression is None else d.regressions(result, fail_on_regression)
    if fmt is OutputFormat.json:
        # allow_nan=False: strict JSON (no NaN/Infinity); bundles with such numbers are invalid input.
        _print_raw(json.dumps(d.to_json(result, regs, fail_on_regression), indent=2, allow_nan=False))
    elif fmt is OutputFormat.markdown:
        _print_raw(d.to_markdown(result, regs, fail_on_regression))
    else:
        out.print(d.to_rich(result, regs, fail_on_regression))
    if regs:
        for r in regs:
            err.print(f"[red]regression[/] {escape(f'{r.path}: {r.key}: {r.describe()}')}")
        raise typer.Exit(EXIT_CHECK_FAILED)


# --- check ------------------------------------------------------------------------------


def check_command(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC", help="Sweep spec (YAML).", exists=True,
                                              dir_okay=False)],
    bundles: Annotated[Path, typer.Option(metavar="DIR", help="Bundle root: the bundles checked are DIR/SKU/*.json, "
                                                              "SKU the --gpu (default: the spec's target GPU); "
                                                              "entries of other SKUs' folders (siblings) never count "
                                                              "as covered (status sibling).",
                                          exists=True, file_okay=False)],
    helion_version: Annotated[str | None, typer.Option(metavar="VERSION",
        help="Expected helion version (default: the one recorded in the newest bundle of the set).")] = None,
    torch_version: Annotated[str | None, typer.Option(metavar="VERSION",
        help="Expected torch version; '2.11.0' also matches '2.11.0+cu130' (default: newest bundle's).")] = None,
    triton_version: Annotated[str | None, typer.Option(metavar="VERSION",
        help="Expected triton version (default: the one recorded in the newest bundle of the set).")] = None,
    fmt: FormatOpt = OutputFormat.table,
    shipped: Annotated[bool, typer.Option("--shipped", help="Check only the part of the sweep the spec's "
                                          "`shipped` section names for the --gpu SKU (what its committed bundle "
                                          "holds).")] = False,
    gpu: Annotated[str | None, typer.Option(metavar="SKU", help="Check the bundles of this GPU SKU, one of the spec "
                                            "target's arch (default: the spec's target GPU).")] = None,
) -> None:
    """Coverage gate: every combo of SPEC has a fresh entry (kernel source and versions) for its GPU."""
    from autotune_cli.review import check as c
    from autotune_cli.spec import SpecError, load_spec
    from mamba_tune.bundle import BundleError

    try:
        spec = load_spec(spec_path, shipped=shipped, gpu=gpu)
        sku = spec.target.gpu
        if not (bundles / sku).is_dir() and any(bundles.glob("*.json")):
            fail(f"--bundles {bundles} holds bundles itself, and {bundles / sku} does not exist: --bundles takes "
                 f"the bundle root, whose SKU folders hold the bundles (e.g. --bundles {bundles.parent})")
        result = c.check_coverage(spec, bundles, {"helion": helion_version, "torch": torch_version,
                                                  "triton": triton_version})
    except (SpecError, BundleError) as e:
        fail(str(e))
    if fmt is OutputFormat.json:
        _print_raw(c.dumps_json(result))
    elif fmt is OutputFormat.markdown:
        _print_raw(c.to_markdown(result))
    else:
        out.print(c.to_rich(result))
    if not result.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


# --- verify -----------------------------------------------------------------------------


def _verify_table(result: VerifyResult, source: str) -> Table:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.4f}"

    def x(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}x"

    ok = len(result.results) - len(result.failed)
    table = Table(title=f"verify {escape(source)}: {ok}/{len(result.results)} ok")
    sibling = result.against is not None
    cols = ["entry", "status", "tuned ms", "default ms", "vs default", "recorded ms", "vs recorded"]
    cols += [f"{result.against.gpu.sku} entry ms", "vs sibling"] if result.against is not None else []
    for col in [*cols, "why"]:
        table.add_column(col, overflow="fold")
    for r in result.results:
        cells = [r.key, "ok" if r.ok else "FAILED", ms(r.tuned_ms), ms(r.default_ms), x(r.vs_default),
                 ms(r.recorded_tuned_ms), "-" if r.vs_recorded_pct is None else f"{r.vs_recorded_pct:+.1f}%"]
        if sibling:
            cells += [ms(r.other_ms) if r.in_other else "not in it", x(r.vs_other)]
        why = r.reasons + [f"sibling's entry: {w}" for w in r.other_reasons]
        table.add_row(*map(Text, [*cells, "; ".join(why)]))  # plain text: error messages may hold '[...]'
    return table


def _against_table(result: VerifyResult, source: str) -> Table:
    """--against: per kernel, this SKU's entries against the sibling's (and the default, mamba-ssm)."""
    from autotune_cli.review.sku_compare import HEADER, cells, summarize

    assert result.against is not None
    a = result.against
    table = Table(title=f"{escape(source)} ({result.bundle_gpu.sku}) against {escape(a.path)} ({a.gpu.sku}) "
                        f"on {escape(result.gpu.name)}: speedups, above 1.00x {result.bundle_gpu.sku}'s entry is faster")
    for col in HEADER:
        table.add_column(col, overflow="fold")
    for s in summarize([r.to_json() for r in result.results]):
        table.add_row(*map(Text, cells(s)))
    return table


def verify_command(
    bundle_path: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A bundle (.json).", exists=True,
                                                dir_okay=False)],
    json_out: Annotated[Path | None, typer.Option(metavar="FILE", help="Also write the results (GPU, versions, per-entry timings "
                                                       "and errors) as JSON to this file.", dir_okay=False)] = None,
    noise_pct: Annotated[float, typer.Option(metavar="PCT",
        min=0.0, help="The tuned config fails if it is slower than the kernel's default config by more than this "
                      "many percent (timing noise).")] = 3.0,
    regression_pct: Annotated[float, typer.Option(metavar="PCT",
        min=0.0, help="The tuned config fails if it is slower than its recorded tuned_ms by more than this "
                      "many percent (e.g. after a helion or triton upgrade).")] = 10.0,
    allow_arch_mismatch: Annotated[bool, typer.Option(
        help="Verify even if this GPU's compute capability differs from the bundle's.")] = False,
    kernel: Annotated[list[str] | None, typer.Option("--kernel", metavar="KERNEL",
        help="Only entries of this kernel (repeatable; default: every entry).")] = None,
    seed: Annotated[int | None, typer.Option("--seed", metavar="SEED",
        min=0, help="Seed of the numerics-check inputs (default: the entry's search seed + 1, as the tuner "
                    "checked it).")] = None,
    against: Annotated[Path | None, typer.Option("--against", metavar="OTHER", exists=True, dir_okay=False,
        help="A bundle of a sibling SKU of the same arch (e.g. the H200's for an H100 bundle): also check and "
             "time its entry for each key, in the same process, and report the speedups per kernel.")] = None,
) -> None:
    """Re-run every entry of BUNDLE on this GPU: compiles, passes numerics, beats the kernel's default config."""
    from autotune_cli.review import verify as v
    from autotune_cli.review.sku_compare import against_problem
    from mamba_tune.bundle import BundleError, load_bundle

    try:
        bundle = load_bundle(bundle_path)
    except BundleError as e:
        fail(str(e))
    other = None
    if against is not None:
        try:
            other = load_bundle(against)
        except BundleError as e:
            fail(f"--against: {str(e).splitlines()[0]}")
        problem = against_problem(bundle.provenance.gpu, other.provenance.gpu)
        if problem is not None:
            fail(f"--against {against}: {problem}")
    if kernel:
        unknown = sorted(set(kernel) - {e.kernel for e in bundle.entries.values()})
        if unknown:
            fail(f"--kernel {', '.join(unknown)}: no entries of that kernel in {bundle_path}")

    def progress(i: int, n: int, entry: Entry, r: v.EntryResult | None) -> None:
        key = entry.key
        if r is None:
            err.print(f"[{i}/{n}] {key} ...", markup=False)
        else:
            status = "[green]ok[/]" if r.ok else "[red]FAILED[/]"
            err.print(f"[{i}/{n}] {escape(key)}: {status} {escape(v.describe(r))} in {r.seconds:.1f}s", markup=True)

    try:
        result = v.verify_bundle(bundle, margins=v.Margins(noise_pct, regression_pct), seed=seed,
                                 kernels=kernel or None, allow_arch_mismatch=allow_arch_mismatch,
                                 against=None if other is None else (str(against), other), progress=progress)
    except v.VerifyInputError as e:
        fail(str(e))
    bv, hv = result.bundle_versions, result.versions
    err.print(f"{bundle_path}: tuned on {result.bundle_gpu.name} with helion {bv.helion}, torch {bv.torch}, "
              f"triton {bv.triton}; verified on {result.gpu.name} with helion {hv.helion}, torch {hv.torch}, "
              f"triton {hv.triton}", markup=False)
    out.print(_verify_table(result, str(bundle_path)))
    if result.against is not None:
        out.print(_against_table(result, str(bundle_path)))
        for side, keys in ((bundle_path, result.against.only_ours), (against, result.against.only_other)):
            if keys:
                out.print(f"only in {side} ({len(keys)}): " + ", ".join(keys), markup=False, highlight=False)
    if json_out is not None:
        try:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(result.to_json(str(bundle_path)), indent=2) + "\n")
        except OSError as e:
            fail(f"--json-out: cannot write {os_error_text(e)}")
        err.print(f"wrote {json_out}", markup=False)
    if result.failed:
        raise typer.Exit(EXIT_CHECK_FAILED)


# --- report -----------------------------------------------------------------------------


def report_command(
    bundle_path: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A bundle (.json).", exists=True,
                                                dir_okay=False)],
    out_dir: Annotated[Path, typer.Option("-o", "--out", metavar="DIR", help="Folder for the PNG plots and report.md (created).",
                                          file_okay=False)],
) -> None:
    """Speedup plots (PNG, one per kernel) and a markdown summary (DIR/report.md) of BUNDLE."""
    from autotune_cli.review.report import ReportDependencyError, ReportInputError, write_report
    from mamba_tune.bundle import BundleError, load_bundle

    try:
        bundle = load_bundle(bundle_path)
        written = write_report(bundle, str(bundle_path), out_dir)
    except (BundleError, ReportDependencyError, ReportInputError) as e:
        fail(str(e))
    except OSError as e:
        fail(f"cannot write the report: {os_error_text(e)}")
    for path in written:
        out.print(str(path), markup=False, highlight=False)


def searches_command(
    a: Annotated[Path, typer.Argument(metavar="A", help="A bundle (.json).", exists=True, dir_okay=False)],
    b: Annotated[Path, typer.Argument(metavar="B", help="A bundle of the same combos (.json).", exists=True,
                                      dir_okay=False)],
    pct: Annotated[float, typer.Option("--pct", metavar="PCT", min=0, help="How close to the better final best counts "
                                       "(percent).")] = 1.0,
) -> None:
    """Two searches of the same combos side by side, from their entries' traces (e.g. `tune` with and
    without --warm-start): each final best, and how soon each came within PCT% of the better one."""
    from autotune_cli.search_trace import compare
    from mamba_tune.bundle import BundleError, load_bundle

    try:
        bundle_a, bundle_b = load_bundle(a), load_bundle(b)
    except BundleError as e:
        fail(str(e))
    lines = compare(bundle_a.entries, bundle_b.entries, pct)
    if not lines:
        fail(f"{a} and {b} share no entry", EXIT_CHECK_FAILED)
    _print_raw("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("diff", cls=Command)(diff_command)
    app.command("check", cls=Command)(check_command)
    app.command("verify", cls=Command)(verify_command)
    app.command("report", cls=Command)(report_command)
    app.command("searches", cls=Command)(searches_command)
