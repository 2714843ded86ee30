"""`mamba-tune validate PATH...` and `mamba-tune show BUNDLE`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from autotune_cli.commands.common import EXIT_BAD_INPUT, EXIT_CHECK_FAILED, Command, err, fail, out
from mamba_tune.keys import all_keys

if TYPE_CHECKING:
    from mamba_tune.bundle import Bundle


def check_bundle_kernels(bundle: Bundle, source: str) -> None:
    """Entries must name known kernels with exactly their key dims."""
    from mamba_tune.bundle import BundleError

    kernels = all_keys()
    for key, entry in bundle.entries.items():
        tk = kernels.get(entry.kernel)
        if tk is None:
            raise BundleError(f"{source}: entries[{key!r}]: unknown kernel {entry.kernel!r}")
        if set(entry.dims) != set(tk.dims):
            raise BundleError(f"{source}: entries[{key!r}].dims: expected exactly {', '.join(tk.dims)}")


class _Progress:
    """`what i/n configs` on stderr: a status line on a terminal, else a line every 30 s."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.last = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        line = f"{self.what} {done}/{total} configs"
        if err.is_terminal:
            err.print(line, markup=False, end="\r")
        elif time.monotonic() - self.last >= 30:
            err.print(line, markup=False)
            self.last = time.monotonic()


def _files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for p in paths:
        if p.is_dir():
            found.extend(sorted(q for q in p.rglob("*") if q.suffix in (".json", ".yaml", ".yml")
                                and not q.name.startswith(".")))
        else:
            found.append(p)
    return found


def validate_command(
    paths: Annotated[list[Path], typer.Argument(metavar="PATH", help="Specs (.yaml) and bundles (.json), or folders of them.",
                                                exists=True)],
    lower: Annotated[bool, typer.Option(help="Also lower every bundle config with Helion's compiler "
                                             "(CPU, no GPU): catches configs the current code rejects.")] = False,
    compile_: Annotated[bool, typer.Option("--compile", help="Also compile every bundle config down to a cubin for "
                                           "the bundle's GPU with Triton and ptxas (CPU, no GPU): catches configs "
                                           "that no longer compile; warns of register spills.")] = False,
) -> None:
    """Validate sweep specs and config bundles; exit 2 on the first invalid file, 1 if a config is rejected (or does
    not lower or compile, with --lower or --compile).

    Specs are checked without torch or helion; a bundle's configs are checked against
    their kernels' config spaces, which imports both (only when a bundle is given)."""
    from autotune_cli.spec import SpecError, load_spec
    from mamba_tune.bundle import BundleError, load_bundle

    files = _files(paths)
    if not files:
        fail("no .yaml or .json files under " + ", ".join(map(str, paths)))
    lowering_failed = False
    bundles = sum(f.suffix == ".json" for f in files)
    seen = 0
    for f in files:
        try:
            if f.suffix == ".json":
                # Progress on stderr: checking a bundle's configs takes seconds per entry.
                seen += 1
                err.print(f"[{seen}/{bundles}] checking {f}", markup=False)
            if f.suffix in (".yaml", ".yml"):
                spec = load_spec(f)
                out.print(f"ok  {f}: spec {spec.name}, {len(spec.models)} model configs, {len(spec.kernels)} kernels",
                          markup=False)
            elif f.suffix == ".json":
                bundle = load_bundle(f)
                check_bundle_kernels(bundle, str(f))
                g = bundle.provenance.gpu
                msg = f"{f}: bundle, {len(bundle.entries)} entries, {len(bundle.failures)} failures, {g.name}"
                file_failed = False
                from autotune_cli.lowering import invalid_configs  # imports torch and helion

                if g.arch == "cpu":  # `sweep --cpu-dry-run`: ref mode, where no config applies
                    msg += ", configs not checked (CPU dry run)"
                else:
                    rejected = invalid_configs(bundle)
                    for key, why in rejected:
                        err.print(f"{f}: {key}: Helion rejects the config: {why}", style="red", markup=False)
                    file_failed |= bool(rejected)
                    msg += f", {len(bundle.entries) - len(rejected)}/{len(bundle.entries)} configs valid"
                if lower:
                    from autotune_cli.lowering import lower_bundle

                    bad = lower_bundle(bundle, _Progress(f"[{seen}/{bundles}] {f}: lowering"))
                    for key, why in bad:
                        err.print(f"[red]{escape(f'{f}: {key}: config does not lower: {why}')}")
                    file_failed |= bool(bad)
                    msg += f", {len(bundle.entries) - len(bad)}/{len(bundle.entries)} configs lower"
                if compile_ and g.arch != "cpu":
                    from autotune_cli.lowering import compile_bundle

                    compiled = compile_bundle(bundle, _Progress(f"[{seen}/{bundles}] {f}: compiling"))
                    for key, usage, why in compiled:
                        if why is not None:
                            err.print(f"{f}: {key}: config does not compile for {g.arch}: {why}", style="red",
                                      markup=False)
                        elif usage["spill_stores"] or usage["spill_loads"]:
                            err.print(f"{f}: {key}: {usage['registers']} registers, spills "
                                      f"{usage['spill_stores']} B stored / {usage['spill_loads']} B loaded",
                                      style="yellow", markup=False)
                    failed = sum(why is not None for _k, _u, why in compiled)
                    spilled = sum(bool(u and (u["spill_stores"] or u["spill_loads"])) for _k, u, _w in compiled)
                    file_failed |= bool(failed)
                    msg += (f", {len(compiled) - failed}/{len(compiled)} configs compile for {g.arch}"
                            f" ({spilled} spill)")
                # A file with a rejected config, or one that does not lower or compile, is FAILED.
                out.print(f"{'FAILED' if file_failed else 'ok'}  {msg}", markup=False)
                lowering_failed |= file_failed
            else:
                fail(f"{f}: not a spec (.yaml) or bundle (.json)")
        except (SpecError, BundleError) as e:
            fail(str(e), EXIT_BAD_INPUT)
    if lowering_failed:
        raise typer.Exit(EXIT_CHECK_FAILED)


def show_command(
    bundle_path: Annotated[Path, typer.Argument(metavar="BUNDLE", help="A bundle (.json).", exists=True,
                                                dir_okay=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print the validated bundle as JSON.")] = False,
) -> None:
    """Show a bundle's provenance and entries as a table."""
    from autotune_cli.search_trace import adopted_note, within_1pct_note
    from mamba_tune.bundle import BundleError, dumps_bundle, load_bundle

    try:
        bundle = load_bundle(bundle_path)
    except BundleError as e:
        fail(str(e))
    if as_json:
        out.print(dumps_bundle(bundle), end="", markup=False, highlight=False)
        return
    p = bundle.provenance
    v = p.versions
    out.print(f"{bundle_path}: {p.gpu.name} ({p.gpu.arch}, {p.gpu.sm_count} SMs); helion {v.helion}, "
              f"torch {v.torch}, triton {v.triton}, CUDA {v.cuda}, driver {v.driver}; "
              f"spec {p.spec.name if p.spec else '-'}; tool {p.tool_version} {p.git_sha or ''}; updated {p.updated}",
              markup=False)
    table = Table()
    for col in ("kernel", "dims", "dtype", "tuned ms", "default ms", "baseline ms", "vs default", "vs baseline",
                "GB/s", "search"):
        table.add_column(col, overflow="fold")
    for e in bundle.entries.values():
        t, s = e.timing, e.search
        table.add_row(*map(Text, (  # plain text: data may hold '[...]'
            e.kernel, ",".join(f"{k}={v}" for k, v in e.dims.items()), e.dtype, f"{t.tuned_ms:.4f}",
            f"{t.default_ms:.4f}", "-" if t.baseline_ms is None else f"{t.baseline_ms:.4f}",
            f"{e.speedup.vs_default:.2f}x", "-" if e.speedup.vs_baseline is None else f"{e.speedup.vs_baseline:.2f}x",
            "-" if t.gbps is None else f"{t.gbps:.0f}",
            adopted_note(s.adopted_from) or
            f"{s.algorithm}/{s.effort} {s.configs_tried or '?'} cfgs {s.seconds:.0f}s{within_1pct_note(s.trace)}",
        )))
    out.print(table)
    for key, f in bundle.failures.items():
        out.print(f"[red]failed[/] {escape(f'{key}: {f.reason}')}")


def register(app: typer.Typer) -> None:
    app.command("validate", cls=Command)(validate_command)
    app.command("show", cls=Command)(show_command)
