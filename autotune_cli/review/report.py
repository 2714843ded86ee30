"""A bundle as pictures and a page: speedup bar charts (PNG) and DIR/report.md.

One figure per kernel: for each tuned shape, the speedup of the tuned config over
the kernel's default config and over the baseline (mamba-ssm), with 1.0x drawn in. Shapes
are labeled by the dims that vary between the kernel's entries. Where entries carry their
search's trace (`search.trace`), a second figure per kernel draws the best config so far
against the search's time. report.md embeds the figures and holds the table of entries (with
when each search came within 1% of its best), the failures and the provenance.

matplotlib is optional (the "report" extra). Figures are drawn with the object API on
an Agg canvas (`matplotlib.figure.Figure`), never pyplot, so no GUI backend or global
state is touched.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from autotune_cli.search_trace import within_1pct_note
from mamba_tune.bundle import Bundle, Entry


class ReportDependencyError(RuntimeError):
    """matplotlib is missing; the message says how to install it."""


class ReportInputError(ValueError):
    """A bundle whose kernel names cannot be file names (one line; nothing is written)."""


def _check_kernel_names(bundle: Bundle, source: str) -> None:
    """Figures are named after kernels (speedup-<kernel>.png): every kernel name must be a safe
    file name (`limits.name_problem`), or a crafted bundle could write outside the report's folder."""
    from autotune_cli.limits import name_problem

    for key, e in sorted(bundle.entries.items()):
        if why := name_problem(e.kernel):
            raise ReportInputError(f"{source}: entries[{key!r}].kernel {why}")


def _figure_class() -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportDependencyError(
            "matplotlib is not installed: `mamba-tune report` needs it (pip install 'mamba-tune[report]')"
        ) from None
    return Figure


def shape_labels(entries: list[Entry]) -> list[str]:
    """Per entry, the dims (and dtype) that differ between entries; all dims if none do."""
    dims = [d for d in entries[0].dims if len({e.dims.get(d) for e in entries}) > 1] if entries else []
    with_dtype = len({e.dtype for e in entries}) > 1
    labels = []
    for e in entries:
        shown = dims if dims or with_dtype else list(e.dims)
        parts = [f"{d}={e.dims[d]}" for d in shown]
        if with_dtype:
            parts.append(e.dtype)
        labels.append("\n".join(parts) if len(parts) <= 3 else ",".join(parts))
    return labels


def _by_kernel(bundle: Bundle) -> dict[str, list[Entry]]:
    groups: dict[str, list[Entry]] = {}
    for e in bundle.entries.values():
        groups.setdefault(e.kernel, []).append(e)
    for entries in groups.values():
        entries.sort(key=lambda e: (e.dtype, sorted(e.dims.items())))
    return dict(sorted(groups.items()))


def _baseline_name(entries: list[Entry]) -> str:
    names = sorted({e.timing.baseline for e in entries if e.timing.baseline})
    return ", ".join(names) if names else "baseline"


def plot_kernel(kernel: str, entries: list[Entry], gpu_name: str, path: Path) -> None:
    """Grouped bars: speedup vs the kernel's default config and vs the baseline, per shape."""
    Figure = _figure_class()
    labels = shape_labels(entries)
    vs_default = [e.speedup.vs_default for e in entries]
    vs_base = [e.speedup.vs_baseline for e in entries]
    has_base = any(v is not None for v in vs_base)
    n = len(entries)
    fig = Figure(figsize=(max(6.0, 1.3 * n + 2.5), 4.8), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    width = 0.38 if has_base else 0.6
    xs = list(range(n))
    left = [x - width / 2 for x in xs] if has_base else xs
    bars = ax.bar(left, vs_default, width, label="vs the default config", color="#4C72B0")
    ax.bar_label(bars, labels=[f"{v:.2f}x" for v in vs_default], fontsize=8, padding=2)
    if has_base:
        heights = [math.nan if v is None else v for v in vs_base]
        bars = ax.bar([x + width / 2 for x in xs], heights, width, label=f"vs {_baseline_name(entries)}",
                      color="#DD8452")
        ax.bar_label(bars, labels=["n/a" if v is None else f"{v:.2f}x" for v in vs_base], fontsize=8, padding=2)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("speedup of the tuned config (x, higher is better)")
    ax.set_ylim(0, max([*vs_default, *(v for v in vs_base if v is not None), 1.0]) * 1.18)
    ax.set_title(f"{kernel} on {gpu_name}")
    ax.legend(loc="upper left", fontsize=8)
    fig.savefig(path)


def plot_search(kernel: str, entries: list[Entry], gpu_name: str, path: Path) -> None:
    """Best so far against time, per shape whose entry has a search trace: the best config's
    time over the search's final best (1.0 = where it ended), as steps at each improvement."""
    Figure = _figure_class()
    fig = Figure(figsize=(7.0, 4.4), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    for label, e in zip(shape_labels(entries), entries, strict=True):
        trace = e.search.trace
        if not trace:
            continue
        final = trace[-1][1]
        xs = [t for t, _ in trace] + [max(e.search.seconds, trace[-1][0])]
        ys = [ms / final for _, ms in trace] + [1.0]
        ax.step(xs, ys, where="post", label=label.replace("\n", ", "), linewidth=1.2)
    ax.axhline(1.01, color="0.5", linestyle=":", linewidth=1)
    ax.set_xlabel("seconds into the search")
    ax.set_ylabel("best so far / final best (lower is better)")
    ax.set_title(f"{kernel} on {gpu_name}: best config so far")
    ax.legend(loc="upper right", fontsize=7)
    fig.savefig(path)


def _geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def _md(text: str) -> str:
    # GFM splits table cells at '|' even inside code spans (entry keys are full of them),
    # and a newline ends the row: a multi-line failure reason stays in its cell as <br>.
    return "<br>".join(text.replace("|", "\\|").splitlines())


def write_report(bundle: Bundle, source: str, out_dir: Path) -> list[Path]:
    """Write one PNG per kernel and report.md into out_dir; return the paths written."""
    _figure_class()  # fail before writing anything when matplotlib is missing
    _check_kernel_names(bundle, source)
    out_dir.mkdir(parents=True, exist_ok=True)
    p = bundle.provenance
    groups = _by_kernel(bundle)
    written: list[Path] = []
    all_default = [e.speedup.vs_default for e in bundle.entries.values()]
    all_base = [e.speedup.vs_baseline for e in bundle.entries.values() if e.speedup.vs_baseline is not None]
    gd, gb = _geomean(all_default), _geomean(all_base)
    title = p.spec.name if p.spec else Path(source).stem
    lines = [
        f"# Tuned configs: {title} on {p.gpu.name}",
        "",
        f"Bundle `{source}`: {len(bundle.entries)} entries over {len(groups)} kernel(s), "
        f"{len(bundle.failures)} failure(s). Geometric-mean speedup of the tuned configs: "
        f"{_x(gd)} vs the kernel's default config"
        + (f", {_x(gb)} vs the baseline ({len(all_base)} entries with a baseline)." if gb else "."),
        "",
    ]
    for kernel, entries in groups.items():
        png = out_dir / f"speedup-{kernel}.png"
        plot_kernel(kernel, entries, p.gpu.name, png)
        written.append(png)
        lines += [f"## {kernel}", "", f"![{kernel}: speedup per shape]({png.name})", ""]
        if any(e.search.trace for e in entries):
            trace_png = out_dir / f"search-{kernel}.png"
            plot_search(kernel, entries, p.gpu.name, trace_png)
            written.append(trace_png)
            lines += [f"![{kernel}: best config so far against search time]({trace_png.name})", ""]
        lines += ["| dims | dtype | tuned ms | default ms | baseline ms | vs default | vs baseline | GB/s | "
                  "TFLOP/s | search |", "|---|---|---|---|---|---|---|---|---|---|"]
        for e in entries:
            t, s = e.timing, e.search
            dims = ", ".join(f"{k}={v}" for k, v in e.dims.items())
            lines.append(
                f"| {dims} | {e.dtype} | {t.tuned_ms:.4f} | {t.default_ms:.4f} | "
                f"{'-' if t.baseline_ms is None else f'{t.baseline_ms:.4f}'} | {_x(e.speedup.vs_default)} | "
                f"{_x(e.speedup.vs_baseline)} | {'-' if t.gbps is None else f'{t.gbps:.0f}'} | "
                f"{'-' if t.tflops is None else f'{t.tflops:.1f}'} | "
                f"{s.algorithm}/{s.effort}, {s.configs_tried or '?'} configs, {s.seconds:.0f} s{within_1pct_note(s.trace)} |")
        lines.append("")
    if bundle.failures:
        lines += ["## Failures", "", "| entry | reason |", "|---|---|"]
        lines += [f"| {_md(f'`{k}`')} | {_md(f.reason)} |" for k, f in sorted(bundle.failures.items())]
        lines.append("")
    v = p.versions
    lines += [
        "## Provenance", "", "| | |", "|---|---|",
        f"| GPU | {p.gpu.name} ({p.gpu.sku}, {p.gpu.arch}, compute capability {p.gpu.compute_capability}, "
        f"{p.gpu.sm_count} SMs) |",
        f"| versions | helion {v.helion}, torch {v.torch}, triton {v.triton}, CUDA {v.cuda or '-'}, "
        f"driver {v.driver or '-'}, Python {v.python} |",
        f"| spec | {'-' if p.spec is None else _md(f'{p.spec.name} (`{p.spec.path}`, sha256 {p.spec.sha256[:12]})')} |",
        f"| tool | mamba-tune {p.tool_version}, git {p.git_sha or '-'} |",
        f"| created / updated | {p.created} / {p.updated} |",
    ]
    for name, k in sorted(p.kernels.items()):
        # Config-space fingerprints per entry (a kernel's packed and unpacked calls have their
        # own); a bundle from before that field has one on the kernel's record.
        fps = Counter(e.search.config_spec_fingerprint for e in bundle.entries.values()
                      if e.kernel == name and e.search.config_spec_fingerprint)
        if fps:
            fp = ", config spaces " + ", ".join(f"{f[:12]} ({n} {'entry' if n == 1 else 'entries'})"
                                                for f, n in sorted(fps.items()))
        else:
            fp = f", config spec {k.config_spec_fingerprint[:12]}" if k.config_spec_fingerprint else ""
        lines.append(f"| kernel {name} | source sha256 {k.source_sha256[:12]}{fp} |")
    md = out_dir / "report.md"
    md.write_text("\n".join(lines) + "\n")
    written.append(md)
    return written
