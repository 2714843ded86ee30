"""Shared pieces of the SSD family: the shape contract and the bundle key's dims.

The stage files (`chunk_cumsum.py` ... `chunk_scan.py`) each hold their Helion kernel,
launcher, public function and runtime declaration; what they have in common lives here:
`check_*`, the shape/dtype contract, raising `ValueError` with the offending sizes, and
the key dims the declarations share. (The tuning side's inputs and baselines are in
`autotune_cli/tuning/ssd/`.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mamba_tune import ref_mode, vocab

# Every SSD stage imports this module: their tensor-core dots run on CPU tensors in
# Helion ref mode (tests, `mamba-tune sweep --cpu-dry-run`) from here on.
ref_mode.install_cpu_dot()

# Bundle-key dims shared by the SSD kernels (each kernel keeps the ones it depends on).
SHAPE_DIMS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")
# Dims the runtime's nearest rule may vary (each within 4x, closest in log space). F1-F3
# and F5 run one head per program, so a config tuned at 64 heads also serves a wider model
# (Nemotron-H 8B: 128 heads) with the same headdim, ngroups, dstate and chunk_size; those
# stay structural (exact match). ngroups does too: F4 runs one group per program, and the
# only measured transfers (on the H200: 8B from Nano TP1) keep it equal.
SIZE_DIMS = ("batch", "seqlen", "nheads")


def size_dims(dims: tuple[str, ...]) -> tuple[str, ...]:
    """The nearest rule's size dims among one kernel's key dims."""
    return tuple(d for d in SIZE_DIMS if d in dims)


def nchunks_of(seqlen: int, chunk_size: int) -> int:
    return math.ceil(seqlen / chunk_size)


# --- shape contract -------------------------------------------------------------------


def check_chunk_size(chunk_size: int) -> None:
    # The kernels tile one chunk as one power-of-two block; tensor-core dots need >= 16.
    if not isinstance(chunk_size, int) or chunk_size < 16 or chunk_size & (chunk_size - 1):
        raise ValueError(f"ssd: chunk_size={chunk_size} must be a power of two >= 16")


def check_float(name: str, t: torch.Tensor) -> None:
    if not vocab.is_float(t.dtype):
        raise ValueError(f"ssd: {name} dtype {t.dtype} is not one of fp32, fp16, bf16")


def check_shape(name: str, t: torch.Tensor, expected: tuple[int, ...], letters: str) -> None:
    if tuple(t.shape) != expected:
        raise ValueError(f"ssd: {name} shape {tuple(t.shape)} != ({letters}) = {expected}")


def check_device(device: torch.device, **tensors: torch.Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"ssd: {name} is on {t.device}, x is on {device}")


def check_seq_idx(seq_idx: torch.Tensor | None, batch: int, seqlen: int) -> None:
    if seq_idx is None:
        return
    check_shape("seq_idx", seq_idx, (batch, seqlen), "batch, seqlen")
    if not vocab.is_index(seq_idx.dtype):
        raise ValueError(f"ssd: seq_idx dtype {seq_idx.dtype} is not int32 or int64")


def check_groups(nheads: int, ngroups: int) -> None:
    if ngroups <= 0 or nheads % ngroups != 0:
        raise ValueError(f"ssd: ngroups={ngroups} does not divide nheads={nheads}")


def check_chunk_inputs(x: torch.Tensor, bc_name: str, bc: torch.Tensor, dt: torch.Tensor,
                       dA_cumsum: torch.Tensor) -> tuple[int, int, int, int, int, int, int, int]:
    """Check x, B or C, and the chunked dt / dA_cumsum that F2 and F5 share.

    Returns (batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size, nchunks).
    """
    if x.dim() != 4:
        raise ValueError(f"ssd: x must be (batch, seqlen, nheads, headdim), got shape {tuple(x.shape)}")
    batch, seqlen, nheads, headdim = x.shape
    if bc.dim() != 4:
        raise ValueError(f"ssd: {bc_name} must be (batch, seqlen, ngroups, dstate), got shape {tuple(bc.shape)}")
    ngroups, dstate = bc.shape[2], bc.shape[3]
    check_groups(nheads, ngroups)
    check_shape(bc_name, bc, (batch, seqlen, ngroups, dstate), "batch, seqlen, ngroups, dstate")
    if dt.dim() != 4:
        raise ValueError(f"ssd: dt must be (batch, nheads, nchunks, chunk_size), got shape {tuple(dt.shape)}")
    chunk_size = dt.shape[3]
    check_chunk_size(chunk_size)
    nchunks = nchunks_of(seqlen, chunk_size)
    check_shape("dt", dt, (batch, nheads, nchunks, chunk_size), "batch, nheads, nchunks, chunk_size")
    check_shape("dA_cumsum", dA_cumsum, tuple(dt.shape), "batch, nheads, nchunks, chunk_size")
    return batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size, nchunks


def expand_D(D: torch.Tensor | None, nheads: int, headdim: int) -> torch.Tensor | None:
    """D (nheads,) or (nheads, headdim) -> a (nheads, headdim) view (stride 0 over headdim for per-head D)."""
    if D is None:
        return None
    if D.shape == (nheads,):
        return D[:, None].expand(nheads, headdim)
    if D.shape == (nheads, headdim):
        return D
    raise ValueError(f"ssd: D shape {tuple(D.shape)} is neither (nheads,) = ({nheads},) "
                     f"nor (nheads, headdim) = ({nheads}, {headdim})")


# --- default configs ------------------------------------------------------------------


def clamped_default(block_sizes: list[int], block_dims: tuple[str, ...], num_warps: int,
                    num_stages: int) -> Callable[[dict[str, int]], dict[str, Any]]:
    """A kernel's default config: these block sizes, each cut to its dim's next power of two
    (at least 16, the dots' minimum), so that small test shapes get valid blocks too."""
    def config(dims: dict[str, int]) -> dict[str, Any]:
        sizes = [min(bs, max(16, 1 << (int(dims[d]) - 1).bit_length())) for bs, d in zip(block_sizes, block_dims,
                                                                                       strict=True)]
        return {"block_sizes": sizes, "num_warps": num_warps, "num_stages": num_stages}

    return config
