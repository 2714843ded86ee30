"""Each tunable kernel's bundle key, torch-free: its dims and how a model layer gives them.

What `plan`, `validate`, `check` and the sweep's planning need of a kernel, without
importing torch or helion (importing them takes seconds; `mamba-tune plan` should not).
The kernels' runtime declarations in `kernels/` hold the same dims and source hash and the
tuning records in `autotune_cli/tuning/` the same `dims_for`: tests/test_kernel_keys.py
checks that all three agree for every kernel and every preset shape.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib.util
from collections.abc import Callable
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """One Mamba-2 layer's sizes after tensor parallelism, at one batch and seqlen."""

    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int
    # Packed sequences: the SSD call gets seq_idx (the norm does not depend on it).
    packed: bool = False
    # The gated norm's weight: fp32 (True), or in the inputs' dtype (a module built in
    # bf16). Only the norm depends on it.
    norm_weight_fp32: bool = True


@dataclasses.dataclass(frozen=True)
class KernelKey:
    name: str
    family: str
    # Bundle key dims, in key order (mamba_tune.runtime.RuntimeKernel.dims).
    dims: tuple[str, ...]
    # Key dims for a layer shape; None when the kernel does not apply to it.
    dims_for: Callable[[ModelShape], dict[str, int] | None]
    # The Helion kernel function, "module:function" (what a bundle's source hash covers).
    source: str
    # Other kernels its stage launches, each with its dims at a layer shape (None where it does
    # not run there): `plan` lists them with it, so a spec that names the stage tunes all of it.
    runs_too: tuple[tuple[str, Callable[[ModelShape], dict[str, int] | None]], ...] = ()

    def source_sha256(self) -> str:
        """mamba_tune.runtime.kernel_source_sha256 of the kernel, read from its file without
        importing it: the function's text from its first decorator to its last line, as
        inspect.getsource gives it."""
        module, _, func = self.source.partition(":")
        path = _kernels_root().joinpath(*module.split(".")[1:]).with_suffix(".py")
        text = path.read_text(encoding="utf-8")
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name == func:
                first = min([d.lineno for d in node.decorator_list] + [node.lineno])
                lines = text.splitlines(keepends=True)[first - 1:node.end_lineno]
                return hashlib.sha256("".join(lines).encode()).hexdigest()
        raise LookupError(f"{self.name}: no function {func} in {path}")




def _kernels_root() -> Path:
    """The `mamba_tune` package's folder (the repository's `kernels/`), found without
    importing it: its kernels load torch and helion."""
    spec = importlib.util.find_spec("mamba_tune")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("mamba_tune is not importable: install the project (pip install -e .)")
    return Path(next(iter(spec.submodule_search_locations)))


# The SSD backward's fp32 partial sums: the dx kernel writes one row of per-position sums per
# block of headdim (without z the dB/dC kernel one of dout . y per block of dstate), whose least
# width `_slot_block` gives (SLOT_P, SLOT_N and slot_block in
# kernels/ssd/chunk_scan_chunk_state_bwd_dx.py), and the state passing backward one d dA_last per
# PARTIAL_SLOT x PARTIAL_SLOT tile of the state (SLOT in chunk_state_passing_bwd.py). The cumsum
# backward folds them in two loops whose trip counts shape its config (Helion offers a static
# range for a loop of 8 iterations, not 16): they are key dims, or a config tuned at one count is
# rejected at another. Mirrored here since this module imports neither torch nor the kernels
# (tests/ssd/test_backward_keys.py checks the two agree).
PARTIAL_SLOT = 16
SLOT_P = 64
SLOT_N = 128


def _slot_block(size: int, cap: int) -> int:
    return max(16, min(cap, size & -size))


def bwd_partials(headdim: int, dstate: int) -> dict[str, int]:
    """The cumsum backward's partial counts at (headdim, dstate): row_partials (per position:
    one per block of headdim or, for the dB/dC kernel's dout . y without z, of dstate, whichever
    is more), last_partials."""
    rows = max(-(-headdim // _slot_block(headdim, SLOT_P)), -(-dstate // _slot_block(dstate, SLOT_N)))
    return {"row_partials": rows, "last_partials": -(-headdim // PARTIAL_SLOT) * -(-dstate // PARTIAL_SLOT)}


def mixer_dims(shape: ModelShape) -> dict[str, int]:
    """Every dim of the call the Mamba-2 mixer makes (mamba_ssm.modules.mamba2): D per head,
    dt_bias, dt_softplus, z applied later by the gated norm, no initial states, and seq_idx
    only for packed sequences (`shape.packed`)."""
    return {
        "batch": shape.batch, "seqlen": shape.seqlen, "nheads": shape.nheads, "headdim": shape.headdim,
        "ngroups": shape.ngroups, "dstate": shape.dstate, "chunk_size": shape.chunk_size,
        "has_dt_bias": 1, "dt_softplus": 1, "has_D": 1, "has_z": 0, "has_seq_idx": int(shape.packed),
        "has_initial_states": 0, **bwd_partials(shape.headdim, shape.dstate),
    }


def pick(dims: dict[str, int], keys: tuple[str, ...]) -> dict[str, int]:
    return {k: int(dims[k]) for k in keys}


NORM_DIMS = ("rows", "d", "group_size", "has_z", "norm_before_gate", "has_bias", "is_rms", "weight_fp32")
SSD_SHAPE_DIMS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")


def _norm(shape: ModelShape) -> dict[str, int]:
    # The call the Mamba-2 mixer makes: RMSNormGated(d_ssm, group_size=d_ssm // ngroups,
    # norm_before_gate=False) on (batch * seqlen) rows, z gate, no bias, the weight's dtype
    # from `shape.norm_weight_fp32`.
    d = shape.nheads * shape.headdim
    return {"rows": shape.batch * shape.seqlen, "d": d, "group_size": d // shape.ngroups, "has_z": 1,
            "norm_before_gate": 0, "has_bias": 0, "is_rms": 1, "weight_fp32": int(shape.norm_weight_fp32)}


def _ssd(dims: tuple[str, ...]) -> Callable[[ModelShape], dict[str, int]]:
    def dims_for(shape: ModelShape) -> dict[str, int]:
        return pick(mixer_dims(shape), dims)

    return dims_for


def _state_passing(shape: ModelShape) -> dict[str, int]:
    # The stage sees whole chunks: seqlen rounded up to a multiple of chunk_size.
    dims = pick(mixer_dims(shape), STATE_PASSING_DIMS)
    dims["seqlen"] = -(-shape.seqlen // shape.chunk_size) * shape.chunk_size
    return dims


def split_state_passing_bwd(batch: int, nheads: int, chunk_size: int) -> bool:
    """Whether the backward runs B2 + B3 split (F2's kernel, then `ssd_state_passing_bwd`'s
    walk) rather than in one walk (`ssd_chunk_state_passing_bwd`) at this shape:
    mamba_tune.ssd.combined.split_state_passing_bwd (its measurements), mirrored (this module
    imports no kernels; tests/ssd/test_state_passing_bwd.py checks the two agree)."""
    return batch * nheads < 64 or chunk_size >= 256


def state_passing_bwd_dims(shape: ModelShape) -> dict[str, int]:
    """B2 + B3's dims at this layer, whichever path runs it. has_dfinal: the training call
    returns no final states, so none come back with a gradient."""
    return {**pick(mixer_dims(shape), CHUNK_STATE_PASSING_BWD_DIMS[:-1]), "has_dfinal": 0}


def _chunk_state_passing_bwd(shape: ModelShape) -> dict[str, int] | None:
    return None if split_state_passing_bwd(shape.batch, shape.nheads, shape.chunk_size) else state_passing_bwd_dims(shape)


def _state_passing_bwd(shape: ModelShape) -> dict[str, int] | None:
    # The walk sees whole chunks: seqlen rounded up to a multiple of chunk_size, as F3.
    if not split_state_passing_bwd(shape.batch, shape.nheads, shape.chunk_size):
        return None
    dims = pick(state_passing_bwd_dims(shape), STATE_PASSING_BWD_DIMS)
    dims["seqlen"] = -(-shape.seqlen // shape.chunk_size) * shape.chunk_size
    return dims


def split_walk_f2_dims(shape: ModelShape) -> dict[str, int] | None:
    """The F2 call the split walk makes before its walk (mamba_tune.ssd.state_passing_bwd._launch):
    F2's kernel with dout as x and C as B and no seq_idx (the walk passes the sequence mask in
    the weights), so F2's unpacked key at this shape; None where the backward walks in one kernel.
    On the H200 that call once ran F2's default config at Zamba2-2.7B: no spec had named
    `ssd_chunk_state` there, since the forward runs F2 + F3 fused."""
    if not split_state_passing_bwd(shape.batch, shape.nheads, shape.chunk_size):
        return None
    return pick(mixer_dims(dataclasses.replace(shape, packed=False)), CHUNK_STATE_DIMS)


def two_pass_dbdc(dstate: int) -> bool:
    """Whether the backward takes dB and dC in two passes (`ssd_chunk_state_scan_bwd_dcb`, then
    `ssd_bmm_bwd_dbdc`) rather than in one kernel (`ssd_chunk_state_scan_bwd_dbdc`):
    mamba_tune.ssd.combined.two_pass_dbdc (its measurements), mirrored (tests/ssd/test_dbdc_two_pass.py
    checks the two agree)."""
    return dstate >= 256


# The two passes split each group's heads into runs as the one kernel does (TARGET_PROGRAMS and
# head_splits in kernels/ssd/chunk_state_scan_bwd_dbdc.py), mirrored: the second pass's key holds the count.
DBDC_TARGET_PROGRAMS = 512


def dbdc_head_runs(batch: int, nchunks: int, ngroups: int, nheads: int) -> int:
    heads_per_group = nheads // ngroups
    want = min(heads_per_group, max(1, -(-DBDC_TARGET_PROGRAMS // (batch * nchunks * ngroups))))
    per_run = -(-heads_per_group // want)
    return -(-heads_per_group // per_run)


def _dbdc_one(shape: ModelShape) -> dict[str, int] | None:
    return None if two_pass_dbdc(shape.dstate) else pick(mixer_dims(shape), CHUNK_STATE_SCAN_BWD_DBDC_DIMS)


def _dbdc_dcb(shape: ModelShape) -> dict[str, int] | None:
    return pick(mixer_dims(shape), DCB_DIMS) if two_pass_dbdc(shape.dstate) else None


def _dbdc_bmm(shape: ModelShape) -> dict[str, int] | None:
    if not two_pass_dbdc(shape.dstate):
        return None
    runs = dbdc_head_runs(shape.batch, -(-shape.seqlen // shape.chunk_size), shape.ngroups, shape.nheads)
    return {**pick(mixer_dims(shape), BMM_BWD_DBDC_DIMS[:-1]), "runs": runs}


def _chunk_scan(shape: ModelShape) -> dict[str, int]:
    # fused_bmm: mamba_tune.ssd.combined.FUSE_BMM_DEFAULT (off), what the training call runs.
    return {**pick(mixer_dims(shape), CHUNK_SCAN_DIMS[:-1]), "fused_bmm": 0}


def decode_dims(shape: ModelShape) -> dict[str, int]:
    """The decoding step's key dims (`selective_state_update`) as Mamba2.step calls it at this
    layer: `batch` sequences of one token (seqlen does not enter), D, dt_bias and softplus,
    no z (the gated norm applies it), dt/dt_bias/A repeated over headdim (tie_hdim), the state
    row b for sequence b, and the state in the model's dtype (its inference cache's)."""
    return {"batch": shape.batch, "nheads": shape.nheads, "headdim": shape.headdim, "ngroups": shape.ngroups,
            "dstate": shape.dstate, "has_D": 1, "has_z": 0, "has_dt_bias": 1, "dt_softplus": 1, "tie_hdim": 1,
            "has_state_batch_indices": 0, "fp32_state": 0}


# The causal conv1d over xBC (mamba_tune.conv1d): the Mamba-2 mixer's call.
CONV1D_FWD_DIMS = ("batch", "seqlen", "dim", "width", "has_bias", "has_seq_idx", "has_initial_states", "silu",
                   "channel_last")
# The backward's two kernels: dpre with dweight and dbias (what the forward reads), then dx
# from dpre (the final states' gradient in, the initial states' out).
CONV1D_BWD_DIMS = CONV1D_FWD_DIMS
CONV1D_BWD_DX_DIMS = ("batch", "seqlen", "dim", "width", "has_seq_idx", "has_dinitial_states", "has_dfinal",
                      "channel_last")
CONV1D_UPDATE_DIMS = ("batch", "dim", "seqlen", "width", "state_len", "has_bias", "silu", "has_cache_seqlens",
                      "has_state_indices")
# d_conv of every model preset (autotune_cli.presets): the conv's width.
D_CONV = 4


def conv1d_fwd_dims(shape: ModelShape) -> dict[str, int]:
    """The conv the Mamba-2 mixer runs (mamba_ssm.modules.mamba2, fused or not): over xBC,
    dim = nheads * headdim + 2 * ngroups * dstate (per TP rank), width d_conv, with bias and
    SiLU, channel-last (xBC (batch, seqlen, dim) rearranged), seq_idx for packed sequences,
    no initial or final states."""
    return {"batch": shape.batch, "seqlen": shape.seqlen, "dim": shape.nheads * shape.headdim
            + 2 * shape.ngroups * shape.dstate, "width": D_CONV, "has_bias": 1, "has_seq_idx": int(shape.packed),
            "has_initial_states": 0, "silu": 1, "channel_last": 1}


def conv1d_bwd_dims(shape: ModelShape) -> dict[str, int]:
    return pick(conv1d_fwd_dims(shape), CONV1D_BWD_DIMS)


def conv1d_bwd_dx_dims(shape: ModelShape) -> dict[str, int]:
    """The mixer's backward asks for no initial states' gradient and has no final states."""
    return pick({**conv1d_fwd_dims(shape), "has_dinitial_states": 0, "has_dfinal": 0}, CONV1D_BWD_DX_DIMS)


def conv1d_update_dims(shape: ModelShape) -> dict[str, int]:
    """The decode step of the same layer (mamba_ssm Mamba2.step): one new position of xBC per
    row of the batch, the state (batch, dim, d_conv) that its inference cache allocates,
    bias and SiLU, no circular buffer or state slots."""
    dims = conv1d_fwd_dims(shape)
    return {"batch": shape.batch, "dim": dims["dim"], "seqlen": 1, "width": D_CONV, "state_len": D_CONV,
            "has_bias": 1, "silu": 1, "has_cache_seqlens": 0, "has_state_indices": 0}


CHUNK_CUMSUM_DIMS = ("batch", "seqlen", "nheads", "chunk_size", "has_dt_bias", "dt_softplus")
CHUNK_STATE_DIMS = (*SSD_SHAPE_DIMS, "has_seq_idx")
CHUNK_STATE_PASSING_DIMS = (*SSD_SHAPE_DIMS, "has_initial_states", "has_seq_idx")
BMM_DIMS = ("batch", "seqlen", "ngroups", "dstate", "chunk_size")
STATE_PASSING_DIMS = ("batch", "seqlen", "nheads", "headdim", "dstate", "chunk_size", "has_initial_states",
                      "has_seq_idx")
CHUNK_SCAN_DIMS = (*SSD_SHAPE_DIMS, "has_D", "has_z", "has_seq_idx", "fused_bmm")
# The backward's kernels.
CHUNK_STATE_PASSING_BWD_DIMS = (*SSD_SHAPE_DIMS, "has_z", "has_seq_idx", "has_dfinal")
STATE_PASSING_BWD_DIMS = ("batch", "seqlen", "nheads", "headdim", "dstate", "chunk_size", "has_seq_idx", "has_dfinal")
CHUNK_SCAN_CHUNK_STATE_BWD_DX_DIMS = (*SSD_SHAPE_DIMS, "has_D", "has_z", "has_seq_idx")
CHUNK_STATE_SCAN_BWD_DBDC_DIMS = (*SSD_SHAPE_DIMS, "has_z", "has_seq_idx")
# B5-B8 in two passes (per shape: two_pass_dbdc): the head-summed dCB and state terms, then the dots.
DCB_DIMS = CHUNK_STATE_SCAN_BWD_DBDC_DIMS
BMM_BWD_DBDC_DIMS = ("batch", "seqlen", "ngroups", "dstate", "chunk_size", "runs")
CHUNK_CUMSUM_BWD_DIMS = (*CHUNK_CUMSUM_DIMS, "row_partials", "last_partials")
# Decoding.
SELECTIVE_STATE_UPDATE_DIMS = ("batch", "nheads", "headdim", "ngroups", "dstate", "has_D", "has_z", "has_dt_bias",
                               "dt_softplus", "tie_hdim", "has_state_batch_indices", "fp32_state")

KEYS: tuple[KernelKey, ...] = (
    KernelKey("causal_conv1d_fwd", "conv1d", CONV1D_FWD_DIMS, conv1d_fwd_dims,
              "mamba_tune.conv1d.fwd:causal_conv1d_fwd_kernel"),
    KernelKey("causal_conv1d_bwd", "conv1d", CONV1D_BWD_DIMS, conv1d_bwd_dims,
              "mamba_tune.conv1d.bwd:causal_conv1d_bwd_kernel"),
    KernelKey("causal_conv1d_bwd_dx", "conv1d", CONV1D_BWD_DX_DIMS, conv1d_bwd_dx_dims,
              "mamba_tune.conv1d.bwd:causal_conv1d_bwd_dx_kernel"),
    KernelKey("causal_conv1d_update", "conv1d", CONV1D_UPDATE_DIMS, conv1d_update_dims,
              "mamba_tune.conv1d.update:causal_conv1d_update_kernel"),
    KernelKey("gated_norm_fwd", "norm", NORM_DIMS, _norm, "mamba_tune.norm.gated:gated_norm_fwd_kernel"),
    KernelKey("gated_norm_bwd", "norm", NORM_DIMS, _norm, "mamba_tune.norm.gated:gated_norm_bwd_kernel"),
    KernelKey("ssd_chunk_cumsum", "ssd", CHUNK_CUMSUM_DIMS, _ssd(CHUNK_CUMSUM_DIMS),
              "mamba_tune.ssd.chunk_cumsum:chunk_cumsum_kernel"),
    KernelKey("ssd_chunk_state", "ssd", CHUNK_STATE_DIMS, _ssd(CHUNK_STATE_DIMS),
              "mamba_tune.ssd.chunk_state:chunk_state_kernel"),
    KernelKey("ssd_state_passing", "ssd", STATE_PASSING_DIMS, _state_passing,
              "mamba_tune.ssd.state_passing:state_passing_kernel"),
    KernelKey("ssd_chunk_state_passing", "ssd", CHUNK_STATE_PASSING_DIMS, _ssd(CHUNK_STATE_PASSING_DIMS),
              "mamba_tune.ssd.chunk_state_passing:chunk_state_passing_kernel"),
    KernelKey("ssd_bmm", "ssd", BMM_DIMS, _ssd(BMM_DIMS), "mamba_tune.ssd.bmm:bmm_chunk_kernel"),
    KernelKey("ssd_chunk_scan", "ssd", CHUNK_SCAN_DIMS, _chunk_scan, "mamba_tune.ssd.chunk_scan:chunk_scan_kernel"),
    KernelKey("ssd_chunk_state_passing_bwd", "ssd", CHUNK_STATE_PASSING_BWD_DIMS, _chunk_state_passing_bwd,
              "mamba_tune.ssd.chunk_state_passing_bwd:chunk_state_passing_bwd_kernel"),
    KernelKey("ssd_state_passing_bwd", "ssd", STATE_PASSING_BWD_DIMS, _state_passing_bwd,
              "mamba_tune.ssd.state_passing_bwd:state_passing_bwd_kernel",
              runs_too=(("ssd_chunk_state", split_walk_f2_dims),)),
    KernelKey("ssd_chunk_scan_chunk_state_bwd_dx", "ssd", CHUNK_SCAN_CHUNK_STATE_BWD_DX_DIMS,
              _ssd(CHUNK_SCAN_CHUNK_STATE_BWD_DX_DIMS),
              "mamba_tune.ssd.chunk_scan_chunk_state_bwd_dx:chunk_scan_chunk_state_bwd_dx_kernel"),
    KernelKey("ssd_chunk_state_scan_bwd_dbdc", "ssd", CHUNK_STATE_SCAN_BWD_DBDC_DIMS, _dbdc_one,
              "mamba_tune.ssd.chunk_state_scan_bwd_dbdc:chunk_state_scan_bwd_dbdc_kernel"),
    KernelKey("ssd_chunk_state_scan_bwd_dcb", "ssd", DCB_DIMS, _dbdc_dcb, "mamba_tune.ssd.dbdc_two_pass:dcb_kernel"),
    KernelKey("ssd_bmm_bwd_dbdc", "ssd", BMM_BWD_DBDC_DIMS, _dbdc_bmm, "mamba_tune.ssd.dbdc_two_pass:dbdc_kernel"),
    KernelKey("ssd_chunk_cumsum_bwd", "ssd", CHUNK_CUMSUM_BWD_DIMS, _ssd(CHUNK_CUMSUM_BWD_DIMS),
              "mamba_tune.ssd.chunk_cumsum_bwd:chunk_cumsum_bwd_kernel"),
    KernelKey("selective_state_update", "ssd", SELECTIVE_STATE_UPDATE_DIMS, decode_dims,
              "mamba_tune.ssd.selective_state_update:selective_state_update_kernel"),
)

_BY_NAME = dict(sorted((k.name, k) for k in KEYS))


def all_keys() -> dict[str, KernelKey]:
    """Name -> key record, sorted by name (the names of autotune_cli.tuning.all_kernels())."""
    return dict(_BY_NAME)
