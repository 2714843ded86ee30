"""The conv1d forward's loads on the layer's slice and on a dense tensor, compiled for sm_90 on a CPU.

Compiles `causal_conv1d_fwd` with an H100 entry's config (default: Zamba2-2.7B batch 4 x 2048 in
generated_configs/h100/short-sequences.json) for both layouts of its input, x dense channel-last
(positions conv_dim apart) and x a slice of a (batch, seqlen, d_in_proj) in_proj output, and
counts the PTX's global loads and stores by width: whether the slice costs vector width.

  python experiments/conv1d_layout/ptx_loads.py [BUNDLE KEY_PREFIX D_IN_PROJ OFFSET]
"""

from __future__ import annotations

import collections
import json
import os
import re
import sys


def main() -> int:
    os.environ.pop("HELION_INTERPRET", None)
    import helion
    import torch

    from autotune_cli import lowering
    from autotune_cli.tuning import get

    path, prefix, d_in, offset = (sys.argv[1:5] if len(sys.argv) == 5 else
                                  ("generated_configs/h100/short-sequences.json", "causal_conv1d_fwd|batch=4",
                                   "10448", "5120"))
    tk = get("causal_conv1d_fwd")
    entries = json.load(open(path))["entries"]
    key = next(k for k in entries if k.startswith(prefix))
    cfg = helion.Config.from_dict(lowering.cpu_loweable(entries[key]["config"])[0])
    dims = entries[key]["dims"]
    dense = lowering.shape_args(tk, dims, "bf16")
    batch, dim, seqlen = dense[0].shape
    big = torch.empty(batch, seqlen, int(d_in), dtype=torch.bfloat16)
    sliced = (big[..., int(offset):int(offset) + dim].transpose(1, 2), *dense[1:])
    print(f"{key}: {cfg.config['block_sizes']} blocks, {cfg.config['num_warps']} warps")
    for name, args in (("dense", dense), ("layer slice", sliced)):
        with lowering.compiled_mode(tk.kernel):
            compiled = lowering.compile_for_gpu(tk.kernel.bind(args), cfg, args)
        ptx = compiled.asm["ptx"]
        loads = collections.Counter(re.findall(r"(ld\.global[\w.]*)", ptx))
        stores = collections.Counter(re.findall(r"(st\.global[\w.]*)", ptx))
        pitch = args[0].stride(2) * args[0].element_size()
        print(f"{name} (a position's row every {pitch} B, {pitch % 128} B off a 128 B line): loads {dict(loads)}, "
              f"stores {dict(stores)}, {lowering.ptxas_usage(compiled)['registers']} registers")
    return 0


if __name__ == "__main__":
    sys.exit(main())
