"""F4 of the SSD forward: CB = C B^T inside each chunk, per group.

CB[b, c, g, i, j] = sum_n C[c*Q + i, g, n] * B[c*Q + j, g, n]; zero for rows or columns
past seqlen and, with seq_idx, between positions of different sequences.

The kernel computes the maskless CB; with seq_idx the launcher zeroes the cross-sequence
entries with one in-place torch op after it (`mask_other_sequences`), on every device. The
mask used to live inside the kernel, where on the H200 (triton 3.6) configs with a 32-wide
dstate step and 128-row or 128-column blocks, Helion's GPU default among them, returned
garbage CB (max error 62.6 at Nano's sizes) while the same configs without it were right.

Order: Helion kernel -> host launcher (shape and dtype checks) -> public function ->
runtime declaration (its tuning record: `autotune_cli/tuning/ssd/`). One program owns a
block_m-row slice of one chunk of one group and all the chunk's columns in block_n
steps, each a tensor-core dot over dstate in block_k steps (fp32 accumulation). The
combined path can skip this stage: F5 recomputes CB in registers instead (see
chunk_scan.py), so this kernel serves the unfused path and tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import helion
import helion.language as hl
import torch

from mamba_tune import keys, runtime
from mamba_tune.ssd import common


@helion.kernel(static_shapes=True, autotuner_fn=runtime.refuse_autotune)
def bmm_chunk_kernel(
    C: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    B: torch.Tensor,  # (batch, seqlen, ngroups, dstate)
    chunk_size: hl.constexpr,
) -> torch.Tensor:
    batch, seqlen, ngroups, dstate = C.shape
    nchunks = (seqlen + chunk_size - 1) // chunk_size
    cb = torch.empty([batch, nchunks, ngroups, chunk_size, chunk_size], dtype=torch.float32, device=C.device)
    block_m = hl.register_block_size(16, chunk_size)
    block_n = hl.register_block_size(16, chunk_size)
    block_k = hl.register_block_size(16, dstate)
    # Rows run over the padded sequence so that every entry of CB is written.
    for tile_g, tile_i, tile_b in hl.tile([ngroups, nchunks * chunk_size, batch], block_size=[1, block_m, 1]):
        b = tile_b.begin
        g = tile_g.begin
        c = tile_i.begin // chunk_size
        c0 = c * chunk_size
        row_ok = tile_i.index < seqlen
        for tile_j in hl.tile(c0, c0 + chunk_size, block_size=block_n):
            col_ok = tile_j.index < seqlen
            acc = hl.zeros([tile_i, tile_j], dtype=torch.float32)
            for tile_k in hl.tile(dstate, block_size=block_k):
                c_blk = hl.load(C, [b, tile_i, g, tile_k], extra_mask=row_ok[:, None])
                b_blk = hl.load(B, [b, tile_j, g, tile_k], extra_mask=col_ok[:, None])
                acc = hl.dot(c_blk, b_blk.T, acc=acc)
            cb[b, c, g, tile_i.index - c0, tile_j.index - c0] = acc
    return cb


# --- host launcher --------------------------------------------------------------------


def _check(C: torch.Tensor, B: torch.Tensor, chunk_size: int, seq_idx: torch.Tensor | None) -> None:
    if C.dim() != 4:
        raise ValueError(f"ssd: C must be (batch, seqlen, ngroups, dstate), got shape {tuple(C.shape)}")
    common.check_shape("B", B, tuple(C.shape), "batch, seqlen, ngroups, dstate of C")
    common.check_float("C", C)
    common.check_float("B", B)
    common.check_chunk_size(chunk_size)
    common.check_seq_idx(seq_idx, C.shape[0], C.shape[1])
    common.check_device(C.device, B=B, seq_idx=seq_idx)


def mask_other_sequences(cb: torch.Tensor, seq_idx: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Zero CB[i, j] where positions i and j of a chunk belong to different sequences (in place).

    Padded positions past seqlen are already 0 in CB (their C/B loads are masked).
    """
    batch, nchunks = cb.shape[0], cb.shape[1]
    pad = nchunks * chunk_size - seq_idx.shape[1]
    ids = torch.nn.functional.pad(seq_idx, (0, pad), value=-1).view(batch, nchunks, 1, chunk_size)
    return cb.masked_fill_(ids.unsqueeze(-1) != ids.unsqueeze(-2), 0.0)


def _launch(C: torch.Tensor, B: torch.Tensor, chunk_size: int, seq_idx: torch.Tensor | None) -> torch.Tensor:
    # One dot dtype: B follows C (mamba-ssm picks the lower of the two; callers pass equal dtypes).
    B = B.to(C.dtype)
    cb = runtime.run(SSD_BMM, (C, B, int(chunk_size)))
    return cb if seq_idx is None else mask_other_sequences(cb, seq_idx, chunk_size)


# --- public function ------------------------------------------------------------------


def bmm_chunk_fwd(
    C: torch.Tensor,
    B: torch.Tensor,
    chunk_size: int,
    seq_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """F4 (mamba-ssm `_bmm_chunk_fwd(C, B, chunk_size, seq_idx, output_dtype=fp32)`).

    C, B: (batch, seqlen, ngroups, dstate); seq_idx: (batch, seqlen) int.
    Returns CB (batch, nchunks, ngroups, chunk_size, chunk_size) fp32.
    """
    _check(C, B, chunk_size, seq_idx)
    return _launch(C, B, chunk_size, seq_idx)


# --- runtime declaration ----------------------------------------------------------------


def _dims_from_args(args: Sequence[Any]) -> dict[str, int]:
    C, _B, chunk_size = args
    batch, seqlen, ngroups, dstate = C.shape
    return {"batch": batch, "seqlen": seqlen, "ngroups": ngroups, "dstate": dstate, "chunk_size": int(chunk_size)}


SSD_BMM = runtime.RuntimeKernel(
    key=keys.SSD_BMM,
    kernel=bmm_chunk_kernel,
    dims_from_args=_dims_from_args,
)
