"""Is a bundle entry's config beaten by a neighbour its search did not settle on?

Takes one entry of a bundle, makes every combination of the values given for some of its config's
fields (a list field's item by index: `block_sizes[0]=64,128`), and for each: compiles it, runs it on
the entry's tuning problem (the record's seeded inputs), checks it against the fp32 reference as
the tuner does, and times it (do_bench median, L2 flushed), all in one process next to the entry's
own config. Prints the variants fastest first, as ratios to the entry's config.

  python experiments/config_variants/time_variants.py BUNDLE KEY [--set FIELD=V1,V2 ...]

e.g. `... generated_configs/h100/nemotron-nano.json 'ssd_chunk_state_scan_bwd_dbdc|batch=2,...|bf16'
--set 'block_sizes[0]=64,128' --set num_warps=4,8`. Needs a CUDA GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import sys
from pathlib import Path
from typing import Any

_FIELD = re.compile(r"^([a-z_]+)(?:\[(\d+)\])?$")


def parse_set(text: str) -> tuple[str, int | None, list[Any]]:
    """'block_sizes[0]=64,128' -> ('block_sizes', 0, [64, 128]); values are JSON (bare words: strings).
    ValueError with what is wrong."""
    field, sep, values = text.partition("=")
    m = _FIELD.match(field.strip())
    if not sep or m is None or not values:
        raise ValueError(f"--set {text!r}: expected FIELD=V1,V2 or FIELD[INDEX]=V1,V2")

    def value(v: str) -> Any:
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v

    return m.group(1), None if m.group(2) is None else int(m.group(2)), [value(v) for v in values.split(",")]


def variants(config: dict[str, Any], sets: list[tuple[str, int | None, list[Any]]]) -> list[dict[str, Any]]:
    """Every combination of the sets' values applied to a copy of config (the config itself
    first when it is one of them). ValueError for a field or index the config lacks."""
    for field, index, _ in sets:
        if field not in config:
            raise ValueError(f"--set {field}: the config has no field {field!r} (has {', '.join(sorted(config))})")
        if index is not None and not (isinstance(config[field], list) and index < len(config[field])):
            raise ValueError(f"--set {field}[{index}]: {field} is {config[field]!r}")
    out = []
    for combo in itertools.product(*(vals for _, _, vals in sets)):
        c = json.loads(json.dumps(config))
        for (field, index, _), v in zip(sets, combo, strict=True):
            if index is None:
                c[field] = v
            else:
                c[field][index] = v
        if c not in out:
            out.append(c)
    out.sort(key=lambda c: c != config)
    return out


def main() -> int:
    import torch

    prog = "time_variants.py"
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("bundle", type=Path)
    p.add_argument("key")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="FIELD=V1,V2")
    a = p.parse_args()
    try:
        sets = [parse_set(s) for s in a.sets]
        entries = json.loads(a.bundle.read_text())["entries"]
        if a.key not in entries:
            raise ValueError(f"{a.bundle}: no entry {a.key!r}")
        entry = entries[a.key]
        todo = variants(entry["config"], sets)
    except (OSError, ValueError, KeyError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU", file=sys.stderr)
        return 2
    import helion

    from autotune_cli.spec import DEFAULT_TOLERANCES
    from autotune_cli.tuner import bench_ms, check_accuracy
    from autotune_cli.tuning import get
    from mamba_tune.vocab import torch_dtype

    tk = get(entry["kernel"])
    device = torch.device("cuda")
    problem = tk.make_problem(entry["dims"], torch_dtype(entry["dtype"]), device, 0)
    bound = tk.kernel.bind(problem.args)
    rows = []
    for i, cfg in enumerate(todo):
        changed = {k: v for k, v in cfg.items() if v != entry["config"][k]}
        label = "the entry's config" if i == 0 and not changed else json.dumps(changed)
        try:
            fn = bound.compile_config(helion.Config(**cfg), allow_print=False)
            acc = check_accuracy(problem, problem.run(fn), DEFAULT_TOLERANCES[entry["dtype"]])
            ms = bench_ms(lambda fn=fn: problem.run(fn), device)
        except Exception as e:  # noqa: BLE001 - a variant that does not compile or run is a row
            print(f"{label}: failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            continue
        rows.append((ms, label, acc.passed))
        print(f"{label}: {ms:.4f} ms{'' if acc.passed else ' FAILS the fp32 check'}", flush=True)
    if not rows:
        return 1
    ref = next((ms for ms, label, _ in rows if label == "the entry's config"), rows[0][0])
    print(f"{torch.cuda.get_device_name()}, {a.key}: fastest first (entry's config / variant)")
    for ms, label, ok in sorted(rows):
        print(f"  {ms:.4f} ms  {ref / ms:.3f}x  {label}{'' if ok else '  (fails the check)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
