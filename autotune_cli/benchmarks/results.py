"""docs/results.md, generated from the benchmark result files in benchmarks/results/.

    mamba-tune results benchmarks/results -o docs/results.md

A result file is the JSON that `mamba-tune bench --json-out FILE` writes (a header naming the
machine, and rows of ours against mamba-ssm in the same process), or a `mamba-tune verify
--json-out` report, or a probe's rows (`what`, `command`, `rows` with `ours_ms`). Its name starts
with the card it ran on (`h200-...json`), which must be the card its machine line names. The
document has a summary per card (the rows the README quotes), what tuning per SKU buys (the
`verify --against` reports: review.sku_compare), the newest figure of every row run in the
default lookup mode, and every file's rows. Torch-free: only JSON and text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune_cli.presets import BENCH_SEQLEN, MODEL_PRESETS, bench_batch
from autotune_cli.review import sku_compare
from mamba_tune.sku import sku_of

CARD_NAME = re.compile(r"([a-z0-9]+)-[A-Za-z0-9._-]+\.json")

# The summary's columns: (family, row, header). Graph rows where there are: replayed from a CUDA
# graph, they leave out host time, which varies between hosts for mamba-ssm's launches.
SUMMARY = (
    ("module", "module_train_step_mem_eff", "Mamba2 training step (fused path)"),
    ("ssd", "fwd_bwd_graph", "SSD forward+backward (graph)"),
    ("ssd", "total_graph", "SSD forward (graph)"),
    ("norm", "gated_norm_fwd", "gated norm forward"),
    ("norm", "gated_norm_bwd", "gated norm backward"),
    ("layer", "layer_fwd_bwd", "Mamba-2 layer forward+backward"),
)

# Measurements a bench row may carry besides its do_bench median: (ours key, theirs key, suffix, unit).
EXTRA = (
    ("ours_wall_ms", "baseline_wall_ms", " (wall)", "ms"),
    ("ours_graph_ms", "baseline_graph_ms", " (graph)", "ms"),
    ("ours_peak_mib", "baseline_peak_mib", " peak memory", "MiB"),
    ("ours_gpu_activities", "baseline_gpu_activities", " GPU activities", ""),
)


class ResultsError(ValueError):
    """One line naming the result file and what is wrong with it."""


@dataclass(frozen=True)
class Row:
    model: str
    label: str
    ours: float
    theirs: float | None
    unit: str = "ms"
    configs: str = ""
    family: str = ""
    no_ratio: bool = False  # the bench refused a ratio (a model row whose sides' losses disagree)

    @property
    def ratio(self) -> float | None:
        """mamba-ssm's over ours: above 1, ours is faster (or smaller)."""
        return self.theirs / self.ours if self.theirs and self.ours > 0 and not self.no_ratio else None


@dataclass(frozen=True)
class Comparison:
    """A `verify BUNDLE --against OTHER` report: the bundle's entries timed against a sibling SKU's."""

    bundle: str  # the verified bundle's name (its file's stem)
    other: str  # the sibling SKU whose entries were timed beside
    rows: list[dict[str, Any]]  # verify's rows (EntryResult.to_json) of the entries that ran
    only_ours: int
    only_other: int


@dataclass
class ResultFile:
    name: str
    card: str
    kind: str  # "bench", "verify" or "probe"
    time: str
    machine: str
    about: str = ""
    command: str = ""
    config_mode: str = "nearest"
    complete: bool = True
    rows: list[Row] = field(default_factory=list)
    comparison: Comparison | None = None


def _number(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v in (float("inf"), float("-inf")):
        raise ResultsError(f"{where}: expected a finite number, got {v!r}")
    return float(v)


def _configs(sources: dict[str, str] | str | None) -> str:
    """How a row's kernels got their configs, counted: '7 exact, 2 default'."""
    if not sources:
        return ""
    values = [sources] if isinstance(sources, str) else list(sources.values())
    counts: dict[str, int] = {}
    for v in values:
        how = str(v).split(" ")[0]
        counts[how] = counts.get(how, 0) + 1
    return ", ".join(f"{n} {how}" for how, n in sorted(counts.items(), key=lambda t: (-t[1], t[0])))


def _shape_label(data: dict[str, Any], family: str) -> str:
    """'' at bench's default batch x seqlen for the family; else ' b8 L2048' after the model, so that
    a row at another shape never stands as, or replaces, the default shape's figure."""
    b, s = data.get("batch"), data.get("seqlen")
    if not isinstance(b, int) or not isinstance(s, int) or (b, s) == (bench_batch(family), BENCH_SEQLEN):
        return ""
    return f" b{b} L{s}"


def _bench_rows(data: dict[str, Any], where: str) -> list[Row]:
    rows = []
    for i, r in enumerate(data["rows"]):
        at = f"{where}: rows[{i}]"
        if not isinstance(r, dict):
            raise ResultsError(f"{at}: a row is an object")
        label = r.get("stage") or r.get("op")
        if not isinstance(label, str) or not isinstance(r.get("model"), str) or not isinstance(r.get("family"), str):
            raise ResultsError(f"{at}: a bench row needs 'family', 'model' and 'stage' (or 'op')")
        if "ours_ms" in r and r["ours_ms"] is None:  # measured as None: a step no CUDA graph captured
            continue
        configs = _configs(r.get("configs") or r.get("config"))
        theirs = r.get("baseline_ms")
        refused = "ratio_note" in r  # benchmarks/model.py: the sides' losses disagree
        model = r["model"] + _shape_label(data, r["family"])
        rows.append(Row(model, label, _number(r.get("ours_ms"), f"{at}.ours_ms"),
                        None if theirs is None else _number(theirs, f"{at}.baseline_ms"),
                        configs=configs, family=r["family"], no_ratio=refused))
        for ours_key, theirs_key, suffix, unit in EXTRA:
            if r.get(ours_key) is not None:
                theirs = r.get(theirs_key)
                rows.append(Row(model, label + suffix, _number(r[ours_key], f"{at}.{ours_key}"),
                                None if theirs is None else _number(theirs, f"{at}.{theirs_key}"), unit,
                                configs, r["family"], refused))
    return rows


def _verify_rows(data: dict[str, Any], where: str) -> list[Row]:
    model = Path(str(data.get("bundle", ""))).stem
    rows = []
    for i, e in enumerate(data["entries"]):
        at = f"{where}: entries[{i}]"
        if not isinstance(e, dict) or not isinstance(e.get("key"), str):
            raise ResultsError(f"{at}: an entry needs its 'key'")
        if e.get("tuned_ms") is None:  # an entry that failed before it was timed: its reasons, no figure
            continue
        theirs = e.get("baseline_ms")
        rows.append(Row(model, e["key"].split("|")[0] + " (verify)", _number(e.get("tuned_ms"), f"{at}.tuned_ms"),
                        None if theirs is None else _number(theirs, f"{at}.baseline_ms")))
    return rows


def _comparison(data: dict[str, Any], where: str) -> Comparison | None:
    """The `against` block of a verify report and its rows, checked (None: a plain verify report)."""
    a = data.get("against")
    if a is None:
        return None
    gpu = a.get("gpu") if isinstance(a, dict) else None
    if not isinstance(gpu, dict) or not isinstance(gpu.get("sku"), str) \
            or not all(isinstance(a.get(k), list) for k in ("only_ours", "only_other")):
        raise ResultsError(f"{where}: against: needs the sibling bundle's gpu.sku, only_ours and only_other")
    rows = []
    for i, e in enumerate(data["entries"]):
        at = f"{where}: entries[{i}]"
        if not isinstance(e.get("kernel"), str):
            raise ResultsError(f"{at}: a row of a `verify --against` report needs its 'kernel'")
        for k in ("vs_other", "vs_default", "vs_baseline"):
            if e.get(k) is not None and not _number(e[k], f"{at}.{k}") > 0:
                raise ResultsError(f"{at}.{k}: a speedup is positive, got {e[k]!r}")
        rows.append(e)
    return Comparison(Path(str(data.get("bundle", ""))).stem, gpu["sku"], rows, len(a["only_ours"]),
                      len(a["only_other"]))


def _probe_rows(data: dict[str, Any], where: str) -> list[Row]:
    theirs = data.get("baseline_ms")
    theirs = None if theirs is None else _number(theirs, f"{where}: baseline_ms")
    rows = []
    for i, r in enumerate(data["rows"]):
        at = f"{where}: rows[{i}]"
        if not isinstance(r, dict):
            raise ResultsError(f"{at}: a row is an object")
        label = ", ".join(f"{k}={v}" for k, v in r.items() if k != "ours_ms" and v is not True)
        label += "".join(f" ({k})" for k, v in r.items() if v is True)
        rows.append(Row(str(data.get("model", "")), label, _number(r.get("ours_ms"), f"{at}.ours_ms"), theirs))
    return rows


def load_file(path: Path) -> ResultFile:
    """One result file, checked; ResultsError (one line) if it is not one."""
    m = CARD_NAME.fullmatch(path.name)
    if m is None:
        raise ResultsError(f"{path}: a result file is named CARD-WHAT.json (e.g. h200-ssd-nano.json)")
    card = m.group(1)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ResultsError(f"{path}: not a readable JSON file: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: a result file is a JSON object")
    if isinstance(data.get("entries"), list) and isinstance(data.get("gpu"), dict):
        kind, machine, time = "verify", str(data["gpu"].get("name", "")), str(data.get("finished", ""))
        ran_on = str(data["gpu"].get("sku", ""))
    elif isinstance(data.get("rows"), list) and isinstance(data.get("machine"), str):
        kind = "bench" if all(isinstance(r, dict) and "family" in r for r in data["rows"]) else "probe"
        machine, time = data["machine"], str(data.get("time", ""))
        ran_on = sku_of(machine.split(",")[0].split("(")[0])
    else:
        raise ResultsError(f"{path}: neither `mamba-tune bench --json-out` rows (machine, rows) "
                           "nor a `mamba-tune verify` report (gpu, entries)")
    if ran_on != card:
        raise ResultsError(f"{path}: named for card {card!r} but measured on {machine!r} ({ran_on})")
    where = str(path)
    rows = {"bench": _bench_rows, "verify": _verify_rows, "probe": _probe_rows}[kind](data, where)
    return ResultFile(name=path.name, card=card, kind=kind, time=time, machine=machine,
                      about=str(data.get("note") or data.get("what") or ""), command=str(data.get("command", "")),
                      config_mode=str(data.get("config_mode") or "nearest"), complete=data.get("complete", True) is not False,
                      rows=rows, comparison=_comparison(data, where) if kind == "verify" else None)


def load_results(folder: Path) -> list[ResultFile]:
    """Every `*.json` in folder, by name; ResultsError if there is none or one is bad."""
    paths = sorted(folder.glob("*.json"))
    if not paths:
        raise ResultsError(f"{folder}: no result files (*.json)")
    return [load_file(p) for p in paths]


# --- the document ----------------------------------------------------------------------------


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    text = f"{v:.0f}" if unit != "ms" else (f"{v:.4f}" if v < 0.1 else f"{v:.3f}")
    return f"{text} {unit}".strip()


def _ratio(r: Row) -> str:
    return "-" if r.ratio is None else f"{r.ratio:.2f}x"


def _baseline(families: set[str]) -> str:
    """The baseline column's name: transformers' own path for the model rows (benchmarks/model.py)."""
    return "transformers" if families == {"model"} else "mamba-ssm" if "model" not in families else "baseline"


def _model_order(model: str) -> tuple[int, int, str]:
    """Presets in autotune_cli.presets' order, TP degrees rising, other names after."""
    name = model.split(" ")[0]
    tp = re.search(r" tp(\d+)\b", model)
    presets = list(MODEL_PRESETS)
    return (presets.index(name) if name in presets else len(presets), int(tp.group(1)) if tp else 1, model)


def latest(files: list[ResultFile]) -> dict[tuple[str, str, str, str], tuple[Row, ResultFile]]:
    """The newest figure of each (card, family, model, row) among the bench files run in the
    default lookup mode (nearest): what the shipped bundles give today, as last measured."""
    best: dict[tuple[str, str, str, str], tuple[Row, ResultFile]] = {}
    for f in files:
        if f.kind != "bench" or f.config_mode != "nearest":
            continue
        for r in f.rows:
            key = (f.card, r.family, r.model, r.label)
            if key not in best or best[key][1].time <= f.time:
                best[key] = (r, f)
    return best


def summary_tables(files: list[ResultFile]) -> list[str]:
    """Per card, one table: a row per model, the SUMMARY columns, each 'ratio (ours / theirs ms)'."""
    newest = latest(files)
    lines: list[str] = []
    for card in sorted({k[0] for k in newest}):
        models = sorted({k[2] for k in newest if k[0] == card
                         and any((card, fam, k[2], row) in newest for fam, row, _ in SUMMARY)}, key=_model_order)
        if not models:
            continue
        lines.append("| card | model | " + " | ".join(h for _, _, h in SUMMARY) + " |")
        lines.append("|---" * (len(SUMMARY) + 2) + "|")
        for model in models:
            cells = []
            for fam, row, _ in SUMMARY:
                hit = newest.get((card, fam, model, row))
                r = hit[0] if hit else None
                cells.append("-" if r is None or r.ratio is None
                             else f"**{r.ratio:.2f}x** ({r.ours:.3f} / {r.theirs:.3f})")
            lines.append(f"| {card.upper()} | {model} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def reproduce_commands(source: str, card: str = "h200") -> list[str]:
    """The commands that measure the summary's rows on a card, then regenerate the document."""
    r = f"{source}/{card}"
    return [
        "```bash",
        "P=\"--model nemotron-3-nano-30b --model nemotron-h-8b --model nemotron-h-47b --model mamba2-2.7b\"",
        "P=\"$P --model zamba2-2.7b --model falcon-h1-0.5b\"",
        "M=\"--module-stage module_train_step_mem_eff\"",
        f"mamba-tune bench --family module $P $M --json-out {r}-module-summary.json",
        f"mamba-tune bench --family module --model nemotron-3-nano-30b --tp 2 $M --json-out {r}-module-summary-tp2.json",
        "mamba-tune bench --family module --model nemotron-3-nano-30b --batch 8 --seqlen 2048 $M \\",
        f"    --json-out {r}-module-summary-b8-l2048.json",
        "S=\"--ssd-stage fwd_bwd_graph --ssd-stage total_graph\"",
        f"mamba-tune bench --family ssd $P $S --json-out {r}-ssd-summary.json",
        f"mamba-tune bench --family ssd --model nemotron-3-nano-30b --tp 2 $S --json-out {r}-ssd-summary-tp2.json",
        f"mamba-tune bench --family norm $P --json-out {r}-norm-summary.json",
        f"mamba-tune bench --family norm --model nemotron-3-nano-30b --tp 2 --json-out {r}-norm-summary-tp2.json",
        "mamba-tune bench --family layer --model nemotron-3-nano-30b --layer-stage layer_fwd_bwd \\",
        f"    --json-out {r}-layer-summary.json",
        f"mamba-tune results {source} -o docs/results.md",
        "```",
    ]


def sku_tuning_section(files: list[ResultFile], source: str) -> list[str]:
    """What tuning per SKU buys: a table per `verify --against` report, and how to measure it."""
    out = ["## What tuning per SKU buys", "",
           "`mamba-tune verify BUNDLE --against OTHER` on a card times, in one process, each entry of the",
           "card's own bundle, the sibling SKU's entry for the same key (what the card runs when it",
           "borrows the sibling's bundle: docs/bundles.md), the kernel's default config and mamba-ssm.",
           "Speedups over them, geomeans over the entries (min and max for the sibling's): above 1.00x",
           "the card's own entry is faster. `compared`: keys both bundles hold and both configs ran;",
           "`same config`: of those, both SKUs' tuning chose one config; `sibling failed`: the",
           "sibling's config did not compile or failed the numerics check on this card.", ""]
    reports = [f for f in files if f.comparison is not None]
    if not reports:
        out += ["Not measured yet.", ""]
    for f in reports:
        c = f.comparison
        assert c is not None
        out += sku_compare.markdown(f.card, c.other, c.bundle, sku_compare.summarize(c.rows))
        out += ["", f"{f.name} ({f.machine}): {c.only_ours} keys only in the {f.card.upper()} bundle, "
                f"{c.only_other} only in the {c.other.upper()} one.", ""]
    out += ["Measure on an H100, then regenerate:", "", "```bash"]
    for spec in ("nemotron-nano", "mamba2-2.7b"):
        out.append(f"mamba-tune verify generated_configs/h100/{spec}.json --against generated_configs/h200/{spec}.json \\")
        out.append(f"    --json-out {source}/h100-verify-{spec}-vs-h200.json")
    out += [f"mamba-tune results {source} -o docs/results.md", "```", ""]
    return out


def render(files: list[ResultFile], source: str) -> str:
    """The whole of docs/results.md."""
    cards = sorted({f.card for f in files})
    out = [
        "# Measured results",
        "",
        f"Generated by `mamba-tune results {source} -o docs/results.md` from the result files in",
        f"`{source}/`; do not edit by hand (`tests/cli/test_results_doc.py` checks that this file is what",
        "the command writes). Each file is one `mamba-tune bench --json-out FILE` run (or a `verify`",
        "report, or a probe's rows) on the card its name starts with; every figure here is labelled",
        "with that card. Ours and mamba-ssm ran in the same process on the same card: times are",
        "`do_bench` medians with L2 flushed unless the row says `wall` (back-to-back calls timed on",
        "the host) or `graph` (back-to-back calls replayed from a CUDA graph: no host time). The",
        "ratio is mamba-ssm's time over ours: above 1.00x ours is faster. `configs` counts how the",
        "row's kernels found their configs at run time (exact entry, nearest entry, default).",
        "",
        f"Cards: {', '.join(c.upper() for c in cards)}. Machines:",
        "",
    ]
    for m in sorted({f.machine for f in files}):
        out.append(f"- {m}")
    out += ["", "## Summary", "",
            "mamba-ssm's time over ours (above 1.00x ours is faster), then ours / mamba-ssm's in ms;",
            "bf16, batch 2, seqlen 8192 (other shapes say so after the model: `b8 L2048`), the newest figure",
            "of each (next section). Graph: 20 back-to-back calls replayed from a CUDA graph, so host time is",
            "left out on both sides. The training step: mamba-ssm's `Mamba2` module (forward and backward",
            "of its input and every parameter) patched against unpatched, causal-conv1d installed.", ""]
    out += summary_tables(files)
    out += ["Reproduce on a card (name the files for it: `h100-...` on an H100), then regenerate:", ""]
    out += reproduce_commands(source)
    out += [""] + sku_tuning_section(files, source)
    out += [
        "## Newest figure of each row",
        "",
        "The newest measurement of each row among the runs in the default lookup mode (nearest), on",
        "the bundles committed when it ran. Rows are `mamba-tune bench` rows (`--ssd-stage`,",
        "`--layer-stage`, `--module-stage`; norm rows by kernel).",
        "",
    ]
    newest = latest(files)
    for card in sorted({k[0] for k in newest}):
        for family in sorted({k[1] for k in newest if k[0] == card}):
            out += [f"### {family} ({card.upper()})", "",
                    f"| model | row | card | ours | {_baseline({family})} | ratio | configs | file |",
                    "|---|---|---|---|---|---|---|---|"]
            keys = sorted((k for k in newest if k[0] == card and k[1] == family), key=lambda k: (_model_order(k[2]), k[3]))
            for k in keys:
                r, f = newest[k]
                out.append(f"| {r.model} | {r.label} | {card.upper()} | {_num(r.ours, r.unit)} | {_num(r.theirs, r.unit)} "
                           f"| {_ratio(r)} | {r.configs or '-'} | {f.name} |")
            out.append("")
    out += ["## Every result file", ""]
    for f in files:
        out += [f"### {f.name}", "", f"Card: {f.card.upper()} ({f.machine})."
                + ("" if f.config_mode == "nearest" else f" Lookup mode: {f.config_mode}.")
                + ("" if f.complete else " Stopped before its last model.")]
        if f.about:
            out += ["", " ".join(f.about.split())]
        if f.command:
            out += ["", f"Command: `{f.command}`"]
        out += ["", f"| model | row | ours | {_baseline({r.family for r in f.rows})} | ratio | configs |",
                "|---|---|---|---|---|---|"]
        for r in f.rows:
            out.append(f"| {r.model or '-'} | {r.label} | {_num(r.ours, r.unit)} | {_num(r.theirs, r.unit)} "
                       f"| {_ratio(r)} | {r.configs or '-'} |")
        out.append("")
    return "\n".join(out).rstrip("\n") + "\n"
