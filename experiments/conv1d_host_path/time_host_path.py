"""The layer's conv1d calls timed three ways on the GPU (host_path.py): do_bench medians (L2
flushed, what `mamba-tune bench --account` reports), wall time of back-to-back calls (the host
included) and CUDA-graph replays (the host left out), for the kernel's compiled host function
alone, the layer's whole call and causal-conv1d's function, in one process.

    python experiments/conv1d_host_path/time_host_path.py [PRESET[@TP] ...] [--json-out FILE]

At each preset (default: Zamba2-2.7B at batch 4 x 2048, Nemotron-3 Nano TP1 at 8 x 2048 and at
2 x 8192) it prints each row's three times; where wall exceeds graph the host sets the pace.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT = ["zamba2-2.7b", "nemotron-3-nano-30b"]
ROWS: list[dict] = []


def _one(label: str, d, tp: int) -> None:
    shapes = [(4, 2048)] if label.startswith("zamba2") else [(8, 2048), (2, 8192)]
    for batch, seqlen in shapes:
        _shape(label, d, tp, batch, seqlen)


def _shape(label: str, d, tp: int, batch: int, seqlen: int) -> None:
    import torch
    from host_path import calls, layer_inputs
    from preset_args import model_shape

    from autotune_cli.benchmarks.common import graph_ms, wall_ms
    from autotune_cli.timing import gpu_median_ms
    from mamba_tune.keys import conv1d_fwd_dims

    shape = model_shape(d, tp, batch, seqlen)
    conv = conv1d_fwd_dims(shape)  # the layer's conv: its width and its rows' stride
    dim, stride = conv["dim"], conv["row_stride"]
    t = layer_inputs(batch, seqlen, dim, stride, "cuda")
    print(f"{label} batch {batch} x {seqlen} (dim {dim}, rows {stride} apart), ms a call:")
    print(f"  {'':22s} {'do_bench':>9s} {'wall':>9s} {'graph':>9s}")
    for name, fn in calls(t).items():
        row = {"do_bench": gpu_median_ms(fn, 100), "wall": wall_ms(fn, 200), "graph": graph_ms(fn, 20, 20)}
        graph = "-" if row["graph"] is None else f"{row['graph']:9.4f}"
        print(f"  {name:22s} {row['do_bench']:9.4f} {row['wall']:9.4f} {graph:>9s}")
        ROWS.append({"preset": label, "batch": batch, "seqlen": seqlen, "call": name,
                     "gpu": torch.cuda.get_device_name(), **row})


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(HERE.parent / "ssd_bwd_paths"))
    from preset_args import run_with_json_out

    return run_with_json_out(argv, DEFAULT, "time_host_path", _one, ROWS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
