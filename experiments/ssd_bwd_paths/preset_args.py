"""The ssd_bwd_paths probes' preset arguments: `PRESET[@TP]` (tensor-parallel degree TP, default 1)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from typing import Any


def parse_presets(argv: list[str], default: list[str], prog: str) -> list[tuple[str, Any, int]] | None:
    """[(label, the preset's ModelDims, tp)] for each argument (or `default`), or None after a
    one-line error on stderr naming a preset that does not exist or a TP that does not divide it."""
    from autotune_cli.presets import MODEL_PRESETS, tp_degrees

    wanted = []
    for arg in argv or default:
        m = re.fullmatch(r"([\w.-]+?)(?:@(\d+))?", arg)
        name, tp = (m.group(1), int(m.group(2) or 1)) if m else (arg, 1)
        if name not in MODEL_PRESETS:
            print(f"{prog}: unknown preset {name!r} in {arg!r}; known: {', '.join(MODEL_PRESETS)}", file=sys.stderr)
            return None
        if tp not in tp_degrees(MODEL_PRESETS[name]):
            print(f"{prog}: {arg!r}: TP {tp} does not divide {name}'s heads and groups "
                  f"(allowed: {tp_degrees(MODEL_PRESETS[name])})", file=sys.stderr)
            return None
        wanted.append((arg, MODEL_PRESETS[name], tp))
    return wanted


def run_per_preset(argv: list[str], default: list[str], prog: str, one: Callable[[str, Any, int], None]) -> int:
    """A GPU script's main: `one(label, dims, tp)` for each preset argument (or `default`);
    exit status 2 after a one-line error for a bad argument or a machine without a CUDA GPU. A
    preset whose run raises gets a one-line error and the next one runs (a device call's time
    is scarce); the exit status is then 1."""
    wanted = parse_presets(argv, default, prog)
    if wanted is None:
        return 2
    import torch

    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU", file=sys.stderr)
        return 2
    failed = 0
    for label, dims, tp in wanted:
        try:
            one(label, dims, tp)
        except Exception as e:  # say which preset and why, go on with the next
            failed += 1
            print(f"{prog}: {label}: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}",
                  file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    return 1 if failed else 0


def run_with_json_out(argv: list[str], default: list[str], prog: str, one: Callable[[str, Any, int], None],
                      rows: list[dict]) -> int:
    """`run_per_preset` for a script that also takes `--json-out FILE`: `rows` (what `one` appended)
    written there as JSON afterwards, when there are any; exit 2 after one line when FILE is missing."""
    import json
    from pathlib import Path

    out = None
    if "--json-out" in argv:
        i = argv.index("--json-out")
        if i + 1 >= len(argv):
            print(f"{prog}: --json-out needs a FILE", file=sys.stderr)
            return 2
        out, argv = argv[i + 1], argv[:i] + argv[i + 2:]
    rc = run_per_preset(argv, default, prog, one)
    if out is not None and rows:
        Path(out).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return rc


def model_shape(d: Any, tp: int, batch: int = 2, seqlen: int = 8192) -> Any:
    """One rank's ModelShape of preset dims `d` at tensor-parallel degree tp (the scripts' bf16
    batch 2, seqlen 8192 by default)."""
    from mamba_tune.keys import ModelShape

    return ModelShape(batch=batch, seqlen=seqlen, nheads=d.nheads // tp, headdim=d.headdim, ngroups=d.ngroups // tp,
                      dstate=d.dstate, chunk_size=d.chunk_size)
