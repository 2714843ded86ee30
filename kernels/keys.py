"""Every tunable kernel's bundle key, declared once: standard library only (no torch, no helion).

Per kernel: its name, family, key dims (in key order), the dims the runtime's nearest rule may
vary (`size_dims`) or cross (`neutral_dims`), the key at a model layer (`dims_for`), the
Helion function whose source a bundle's provenance hashes (`source`), and the per-shape
dispatch rules and constants the keys depend on. The kernel files' runtime declarations
(`mamba_tune.runtime.RuntimeKernel(key=...)`) and the CLI (`plan`, `validate`, `check`, the
tuning records) read it; `import mamba_tune.keys` loads no torch, so those commands start fast.

`source_sha256` is the one source hash: the runtime's stale-source check and the CLI's
provenance both call it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

_ROOT = Path(__file__).resolve().parent


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


DimsFor = Callable[[ModelShape], "dict[str, int] | None"]


@dataclasses.dataclass(frozen=True)
class KernelKey:
    name: str
    family: str
    # Bundle key dims, in key order. All ints (flags are 0/1).
    dims: tuple[str, ...]
    # Dims that the runtime's "nearest" rule may vary (sizes, not structure).
    size_dims: tuple[str, ...]
    # Key dims for a layer shape; None when the kernel does not run at it.
    dims_for: DimsFor
    # The Helion kernel function, "module:function" (what a bundle's source hash covers).
    source: str
    # Structural dims that leave the config space unchanged (the same Helion structural
    # fingerprint for every value: tests/tuner/test_warm_start.py), so that a config tuned at one
    # value runs at another: the "nearest" rule may cross them when no entry has the call's
    # value, and tuning may seed a search from the other values' entries.
    neutral_dims: tuple[str, ...] = ()
    # Other kernels its stage launches, each with its dims at a layer shape (None where it does
    # not run there): `plan` lists them with it, so a spec that names the stage tunes all of it.
    runs_too: tuple[tuple[str, DimsFor], ...] = ()
    # For a kernel that no layer runs (dims_for None at every shape): its key dims for a call off
    # the layers, at a layer's sizes (what the lowering, seed and loop-carry checks use).
    off_layer_dims: DimsFor | None = None

    def __post_init__(self) -> None:
        bad = set(self.size_dims) - set(self.dims)
        if bad:
            raise ValueError(f"{self.name}: size_dims {sorted(bad)} are not key dims")
        bad = set(self.neutral_dims) - set(self.dims) | set(self.neutral_dims) & set(self.size_dims)
        if bad:
            raise ValueError(f"{self.name}: neutral_dims {sorted(bad)} are not structural key dims")

    def dims_to_check(self, shape: ModelShape) -> dict[str, int] | None:
        """The dims at which to check the kernel at `shape`: the layer's, else `off_layer_dims`'."""
        dims = self.dims_for(shape)
        if dims is None and self.off_layer_dims is not None:
            dims = self.off_layer_dims(shape)
        return dims

    @property
    def function(self) -> str:
        return self.source.partition(":")[2]

    def source_path(self) -> Path:
        """The file that defines the kernel function: inside this package, found without importing
        it; else (an experiment's kernel) where its importable module is."""
        module = self.source.partition(":")[0]
        if module.split(".")[0] == "mamba_tune":
            return _ROOT.joinpath(*module.split(".")[1:]).with_suffix(".py")
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ModuleNotFoundError(f"{self.name}: no module {module} (its source {self.source})")
        return Path(spec.origin).resolve()

    def source_sha256(self) -> str:
        """What a bundle's provenance records: a changed kernel invalidates its entries."""
        return source_sha256(self.source_path(), self.function)


def source_sha256(path: Path, function: str) -> str:
    """sha256 of a top-level function's source, read from its file without importing it: the
    text from its first decorator to its last line (what inspect.getsource gives). Kept per
    file version (its mtime and size): a sweep asks for every kernel's, for each bundle, per combo."""
    st = path.stat()
    return _source_sha256(str(path), function, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=256)
def _source_sha256(path: str, function: str, _mtime_ns: int, _size: int) -> str:
    text = Path(path).read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            first = min([d.lineno for d in node.decorator_list] + [node.lineno])
            lines = text.splitlines(keepends=True)[first - 1:node.end_lineno]
            return hashlib.sha256("".join(lines).encode()).hexdigest()
    raise LookupError(f"no function {function} in {path}")


def pick(dims: dict[str, int], keys: tuple[str, ...]) -> dict[str, int]:
    return {k: int(dims[k]) for k in keys}


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- SSD: dispatch rules and the constants keys depend on ---------------------------------

# The SSD backward's fp32 partial sums: the dx kernel writes one row of per-position sums per
# block of headdim (without z the dB/dC kernel one of dout . y per block of dstate), whose least
# width `slot_block` gives, and the state passing backward one d dA_last per
# PARTIAL_SLOT x PARTIAL_SLOT tile of the state. The cumsum backward folds them in two loops
# whose trip counts shape its config (Helion offers a static range for a loop of 8 iterations,
# not 16): they are key dims, or a config tuned at one count is rejected at another.
PARTIAL_SLOT = 16
SLOT_P = 64
SLOT_N = 128


def slot_block(size: int, cap: int) -> int:
    """The least block size over a dim of `size` whose blocks each get a slot of rows (headdim
    in the dx kernel, cap SLOT_P; dstate in the dB/dC kernel, cap SLOT_N): a power of two, at least
    16 (the dots' least), at most the largest power of two dividing size and at most cap. The
    kernels register their blocks with this least, so no config makes more than ceil(size / it)."""
    return max(16, min(cap, size & -size))


def row_slots(headdim: int, dstate: int) -> int:
    """Partial slots per position in the dx kernel's rows: one per block of headdim (its ddt~
    sums) or of dstate (the dB/dC kernel's dout . y sums without z), the most any config makes."""
    return max(cdiv(headdim, slot_block(headdim, SLOT_P)), cdiv(dstate, slot_block(dstate, SLOT_N)))


def last_slots(headdim: int, dstate: int) -> int:
    """The state passing backward's d dA_last partials: one per PARTIAL_SLOT-square state tile."""
    return cdiv(headdim, PARTIAL_SLOT) * cdiv(dstate, PARTIAL_SLOT)


def bwd_partials(headdim: int, dstate: int) -> dict[str, int]:
    """The cumsum backward's partial counts at (headdim, dstate)."""
    return {"row_partials": row_slots(headdim, dstate), "last_partials": last_slots(headdim, dstate)}


def split_state_passing_bwd(batch: int, nheads: int, chunk_size: int) -> bool:
    """Whether the backward runs B2 + B3 split (F2's kernel for every chunk's term, then
    `ssd_state_passing_bwd`'s elementwise walk) rather than in one walk
    (`ssd_chunk_state_passing_bwd`) at this shape: where the one walk has few chains to run side
    by side (batch * nheads < 64) or long steps (each a dot over chunk_size >= 256 positions).
    Both paths were timed at every preset on the H200
    (`experiments/ssd_bwd_paths/state_passing_bwd_paths.py`): the split won at Falcon-H1, Mamba2
    and Zamba2 (Falcon-H1 0.168 against 0.199 ms), the one walk at Nemotron-3 Nano, 8B and 47B
    (Nano TP1 0.248 against 0.303 ms); docs/results.md has the whole steps."""
    return batch * nheads < 64 or chunk_size >= 256


def two_pass_dbdc(dstate: int) -> bool:
    """Whether the backward takes dB and dC in two passes (`ssd_chunk_state_scan_bwd_dcb`, then
    `ssd_bmm_bwd_dbdc`) rather than in one kernel (`ssd_chunk_state_scan_bwd_dbdc`): at
    dstate >= 256, where the one kernel rebuilds each dCB tile for every dstate block it holds.
    Both were timed at every preset on the H200 (`experiments/ssd_bwd_paths/dbdc_paths.py`): two
    passes won only at dstate 256 (Nemotron-H 47B: 4.058 against 5.194 ms), the one kernel at
    every dstate <= 128 (Nano: 0.645 against 0.831 ms); docs/results.md has the whole steps."""
    return dstate >= 256


# Head runs per group of the dB/dC kernels: enough (chunk, group, run) triples for about this
# many programs per dstate block (4 per SM on the H200's 132 SMs), and at most one run per head.
DBDC_TARGET_PROGRAMS = 512


def dbdc_head_runs(batch: int, nchunks: int, ngroups: int, nheads: int) -> int:
    """How many runs the dB/dC kernels split each group's heads into (1: no split, no partials)."""
    heads_per_group = nheads // ngroups
    want = min(heads_per_group, max(1, cdiv(DBDC_TARGET_PROGRAMS, batch * nchunks * ngroups)))
    per_run = cdiv(heads_per_group, want)
    return cdiv(heads_per_group, per_run)


# --- SSD keys ----------------------------------------------------------------------------

SSD_SHAPE_DIMS = ("batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size")
# Dims the runtime's nearest rule may vary (each within 4x, closest in log space). F1-F3
# and F5 run one head per program, so a config tuned at 64 heads also serves a wider model
# (Nemotron-H 8B: 128 heads) with the same headdim, ngroups, dstate and chunk_size; those
# stay structural (exact match). ngroups does too: F4 runs one group per program, and the
# only measured transfers (H200, 2026-11-29: 8B from Nano TP1) keep it equal.
SSD_SIZE_DIMS = ("batch", "seqlen", "nheads")


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


def _whole_chunks(dims: dict[str, int], shape: ModelShape) -> dict[str, int]:
    # The state passing walks see whole chunks: seqlen rounded up to a multiple of chunk_size.
    return {**dims, "seqlen": cdiv(shape.seqlen, shape.chunk_size) * shape.chunk_size}


def _ssd(name: str, dims: tuple[str, ...], source: str, dims_for: DimsFor | None = None,
         runs_too: tuple[tuple[str, DimsFor], ...] = ()) -> KernelKey:
    """An SSD key; `dims_for` defaults to the mixer call's dims picked."""
    return KernelKey(name, "ssd", dims, tuple(d for d in SSD_SIZE_DIMS if d in dims),
                     dims_for or (lambda shape: pick(mixer_dims(shape), dims)), f"mamba_tune.ssd.{source}",
                     runs_too=runs_too)


def state_passing_bwd_dims(shape: ModelShape) -> dict[str, int]:
    """B2 + B3's dims at this layer, whichever path runs it. has_dfinal: the training call
    returns no final states, so none come back with a gradient."""
    return {**pick(mixer_dims(shape), (*SSD_SHAPE_DIMS, "has_z", "has_seq_idx")), "has_dfinal": 0}


def split_walk_f2_dims(shape: ModelShape) -> dict[str, int] | None:
    """The F2 call the split walk makes before its walk (mamba_tune.ssd.state_passing_bwd._launch):
    F2's kernel with dout as x and C as B and no seq_idx (the walk passes the sequence mask in
    the weights), so F2's unpacked key at this shape; None where the backward walks in one kernel."""
    if not split_state_passing_bwd(shape.batch, shape.nheads, shape.chunk_size):
        return None
    return SSD_CHUNK_STATE.dims_for(dataclasses.replace(shape, packed=False))


def _dbdc_runs(shape: ModelShape) -> int:
    return dbdc_head_runs(shape.batch, cdiv(shape.seqlen, shape.chunk_size), shape.ngroups, shape.nheads)


def _dbdc_bmm(shape: ModelShape) -> dict[str, int] | None:
    if not two_pass_dbdc(shape.dstate):
        return None
    return {**pick(mixer_dims(shape), SSD_BMM_BWD_DBDC.dims[:-1]), "runs": _dbdc_runs(shape)}


def decode_dims(shape: ModelShape) -> dict[str, int]:
    """The decoding step's key dims (`selective_state_update`) as Mamba2.step calls it at this
    layer: `batch` sequences of one token (seqlen does not enter), D, dt_bias and softplus,
    no z (the gated norm applies it), dt/dt_bias/A repeated over headdim (tie_hdim), the state
    row b for sequence b, and the state in the model's dtype (its inference cache's)."""
    return {"batch": shape.batch, "nheads": shape.nheads, "headdim": shape.headdim, "ngroups": shape.ngroups,
            "dstate": shape.dstate, "has_D": 1, "has_z": 0, "has_dt_bias": 1, "dt_softplus": 1, "tie_hdim": 1,
            "has_state_batch_indices": 0, "fp32_state": 0}


_CUMSUM_DIMS = ("batch", "seqlen", "nheads", "chunk_size", "has_dt_bias", "dt_softplus")
_DBDC_DIMS = (*SSD_SHAPE_DIMS, "has_z", "has_seq_idx")

SSD_CHUNK_CUMSUM = _ssd("ssd_chunk_cumsum", _CUMSUM_DIMS, "chunk_cumsum:chunk_cumsum_kernel")
SSD_CHUNK_STATE = _ssd("ssd_chunk_state", (*SSD_SHAPE_DIMS, "has_seq_idx"), "chunk_state:chunk_state_kernel")
SSD_CHUNK_STATE_PASSING = _ssd("ssd_chunk_state_passing", (*SSD_SHAPE_DIMS, "has_initial_states", "has_seq_idx"),
                               "chunk_state_passing:chunk_state_passing_kernel")
# No has_seq_idx: the kernel is the same with and without it (the mask runs after it).
SSD_BMM = _ssd("ssd_bmm", ("batch", "seqlen", "ngroups", "dstate", "chunk_size"), "bmm:bmm_chunk_kernel")
SSD_CHUNK_SCAN = _ssd("ssd_chunk_scan", (*SSD_SHAPE_DIMS, "has_D", "has_z", "has_seq_idx"),
                      "chunk_scan:chunk_scan_kernel")
# The backward's kernels.
SSD_CHUNK_STATE_PASSING_BWD = _ssd(
    "ssd_chunk_state_passing_bwd", (*SSD_SHAPE_DIMS, "has_z", "has_seq_idx", "has_dfinal"),
    "chunk_state_passing_bwd:chunk_state_passing_bwd_kernel",
    lambda shape: None if split_state_passing_bwd(shape.batch, shape.nheads, shape.chunk_size)
    else state_passing_bwd_dims(shape))
SSD_STATE_PASSING_BWD = _ssd(
    "ssd_state_passing_bwd",
    ("batch", "seqlen", "nheads", "headdim", "dstate", "chunk_size", "has_seq_idx", "has_dfinal"),
    "state_passing_bwd:state_passing_bwd_kernel",
    lambda shape: _whole_chunks(pick(state_passing_bwd_dims(shape), SSD_STATE_PASSING_BWD.dims), shape)
    if split_state_passing_bwd(shape.batch, shape.nheads, shape.chunk_size) else None,
    runs_too=(("ssd_chunk_state", split_walk_f2_dims),))
SSD_CHUNK_SCAN_CHUNK_STATE_BWD_DX = _ssd(
    "ssd_chunk_scan_chunk_state_bwd_dx", (*SSD_SHAPE_DIMS, "has_D", "has_z", "has_seq_idx"),
    "chunk_scan_chunk_state_bwd_dx:chunk_scan_chunk_state_bwd_dx_kernel")
SSD_CHUNK_STATE_SCAN_BWD_DBDC = _ssd(
    "ssd_chunk_state_scan_bwd_dbdc", _DBDC_DIMS, "chunk_state_scan_bwd_dbdc:chunk_state_scan_bwd_dbdc_kernel",
    lambda shape: None if two_pass_dbdc(shape.dstate) else pick(mixer_dims(shape), _DBDC_DIMS))
# B5-B8 in two passes (per shape: two_pass_dbdc): the head-summed dCB and state terms, then the dots.
SSD_CHUNK_STATE_SCAN_BWD_DCB = _ssd(
    "ssd_chunk_state_scan_bwd_dcb", _DBDC_DIMS, "dbdc_two_pass:dcb_kernel",
    lambda shape: pick(mixer_dims(shape), _DBDC_DIMS) if two_pass_dbdc(shape.dstate) else None)
SSD_BMM_BWD_DBDC = _ssd("ssd_bmm_bwd_dbdc", ("batch", "seqlen", "ngroups", "dstate", "chunk_size", "runs"),
                        "dbdc_two_pass:dbdc_kernel", _dbdc_bmm)
# row_partials / last_partials: the partial sums folded per position and per chunk (`bwd_partials`).
SSD_CHUNK_CUMSUM_BWD = _ssd("ssd_chunk_cumsum_bwd", (*_CUMSUM_DIMS, "row_partials", "last_partials"),
                            "chunk_cumsum_bwd:chunk_cumsum_bwd_kernel")
# Decoding.
SELECTIVE_STATE_UPDATE = KernelKey(
    "selective_state_update", "ssd",
    ("batch", "nheads", "headdim", "ngroups", "dstate", "has_D", "has_z", "has_dt_bias", "dt_softplus", "tie_hdim",
     "has_state_batch_indices", "fp32_state"),
    ("batch", "nheads"), decode_dims, "mamba_tune.ssd.selective_state_update:selective_state_update_kernel")


# --- conv1d -------------------------------------------------------------------------------

# d_conv of every model preset (autotune_cli.presets): the conv's width.
D_CONV = 4
# Dims the runtime's nearest rule may vary: a config tuned at one model's xBC width and
# sequence length serves neighbouring ones (each within 4x); width, the flags and the
# layout stay structural.
CONV1D_SIZE_DIMS = ("batch", "seqlen", "dim")
# The layer hands the conv xBC as a slice of in_proj's output (z, xBC, dt per position), so its
# positions are d_in_proj elements apart, not dim: at Zamba2-2.7B 10448 elements (16 off a
# multiple of 64; 20896 B, 32 B off a 128 B line). A config tuned on dense rows ran 0.96x (forward)
# and 0.93x (backward) of causal-conv1d there on an H100; tuned on the layer's rows, 1.02x both.
# Rows as aligned as the layer's but about as wide as the conv's input were not enough: on an
# H100 entries tuned so ran 0.94x (Zamba2 batch 4 x 2048 forward), 0.93x (Mamba2-2.7B backward)
# and 0.96x / 0.97x (Nano batch 8 x 2048) of causal-conv1d in the step, where their searches had
# measured 0.99-1.06x (docs/status.md). So the layer kernels key on `row_stride`: the elements
# between x's consecutive rows (positions channel-last, channels contiguous), which the tuning
# problem lays out as it is: in the layer, in_proj's width.


def row_stride(*, channel_last: bool, strides: tuple[int, ...]) -> int:
    """The `row_stride` key dim of a (batch, dim, seqlen) tensor with these strides (elements):
    its position stride channel-last, its channel stride otherwise."""
    return strides[2] if channel_last else strides[1]


def in_proj_width(shape: ModelShape) -> int:
    """The width of the Mamba-2 mixer's in_proj output per TP rank (z, xBC, dt; no MLP part):
    the position stride of the xBC slice the conv reads."""
    return 2 * shape.nheads * shape.headdim + 2 * shape.ngroups * shape.dstate + shape.nheads


def conv1d_fwd_dims(shape: ModelShape) -> dict[str, int]:
    """The conv the Mamba-2 mixer runs (mamba_ssm.modules.mamba2, fused or not): over xBC,
    dim = nheads * headdim + 2 * ngroups * dstate (per TP rank), width d_conv, with bias and
    SiLU, channel-last (xBC (batch, seqlen, dim) rearranged, a slice of in_proj's output: its
    rows `in_proj_width` apart), seq_idx for packed sequences, no initial or final states."""
    return {"batch": shape.batch, "seqlen": shape.seqlen, "dim": shape.nheads * shape.headdim
            + 2 * shape.ngroups * shape.dstate, "width": D_CONV, "has_bias": 1, "has_seq_idx": int(shape.packed),
            "has_initial_states": 0, "silu": 1, "channel_last": 1, "row_stride": in_proj_width(shape)}


def _conv1d_bwd_dims(dims: tuple[str, ...]) -> DimsFor:
    # The mixer's backward asks for no initial states' gradient and has no final states.
    return lambda shape: pick({**conv1d_fwd_dims(shape), "has_dinitial_states": 0, "has_dfinal": 0}, dims)


def conv1d_update_dims(shape: ModelShape) -> dict[str, int]:
    """The decode step of the same layer (mamba_ssm Mamba2.step): one new position of xBC per
    row of the batch, the state (batch, dim, d_conv) that its inference cache allocates,
    bias and SiLU, no circular buffer or state slots."""
    return {"batch": shape.batch, "dim": conv1d_fwd_dims(shape)["dim"], "seqlen": 1, "width": D_CONV,
            "state_len": D_CONV, "has_bias": 1, "silu": 1, "has_cache_seqlens": 0, "has_state_indices": 0}


_CONV1D_DIMS = ("batch", "seqlen", "dim", "width", "has_bias", "has_seq_idx", "has_initial_states", "silu",
                "channel_last")
# The kernels a layer runs key on its rows' stride too; any value leaves the config space as it
# is, so a config tuned at one serves the others (nearest) until they are tuned.
_CONV1D_FWD_DIMS = (*_CONV1D_DIMS, "row_stride")

CAUSAL_CONV1D_FWD = KernelKey("causal_conv1d_fwd", "conv1d", _CONV1D_FWD_DIMS, CONV1D_SIZE_DIMS, conv1d_fwd_dims,
                              "mamba_tune.conv1d.fwd:causal_conv1d_fwd_kernel", neutral_dims=("row_stride",))
# The backward of channel-last calls (the Mamba-2 layer's xBC): one kernel stepping rows
# (bwd_slide.py). Its dims are the forward's plus which state gradients flow.
_CONV1D_BWD_SLIDE_DIMS = (*_CONV1D_FWD_DIMS, "has_dinitial_states", "has_dfinal")
CAUSAL_CONV1D_BWD_SLIDE = KernelKey("causal_conv1d_bwd_slide", "conv1d", _CONV1D_BWD_SLIDE_DIMS, CONV1D_SIZE_DIMS,
                                    _conv1d_bwd_dims(_CONV1D_BWD_SLIDE_DIMS),
                                    "mamba_tune.conv1d.bwd_slide:causal_conv1d_bwd_slide_kernel",
                                    neutral_dims=("row_stride",))


def _not_at_layers(shape: ModelShape) -> None:
    """The two-kernel backward serves calls whose rows are not channel-last; no model layer makes
    one (its xBC is channel-last), so no spec plans it."""
    return None


def _contiguous_bwd_dims(dims: tuple[str, ...]) -> DimsFor:
    # The layer's conv in the contiguous layout: the two kernels' calls (for their checks).
    return lambda shape: pick({**conv1d_fwd_dims(shape), "has_dinitial_states": 0, "has_dfinal": 0,
                               "channel_last": 0}, dims)


# The backward of every other call, two kernels: dpre with dweight and dbias (it reads what the
# forward reads), then dx from dpre (the final states' gradient in, the initial states' out).
CAUSAL_CONV1D_BWD = KernelKey("causal_conv1d_bwd", "conv1d", _CONV1D_DIMS, CONV1D_SIZE_DIMS, _not_at_layers,
                              "mamba_tune.conv1d.bwd:causal_conv1d_bwd_kernel",
                              off_layer_dims=_contiguous_bwd_dims(_CONV1D_DIMS))
_CONV1D_BWD_DX_DIMS = ("batch", "seqlen", "dim", "width", "has_seq_idx", "has_dinitial_states", "has_dfinal",
                       "channel_last")
CAUSAL_CONV1D_BWD_DX = KernelKey("causal_conv1d_bwd_dx", "conv1d", _CONV1D_BWD_DX_DIMS, CONV1D_SIZE_DIMS,
                                 _not_at_layers, "mamba_tune.conv1d.bwd:causal_conv1d_bwd_dx_kernel",
                                 off_layer_dims=_contiguous_bwd_dims(_CONV1D_BWD_DX_DIMS))
CAUSAL_CONV1D_UPDATE = KernelKey(
    "causal_conv1d_update", "conv1d",
    ("batch", "dim", "seqlen", "width", "state_len", "has_bias", "silu", "has_cache_seqlens", "has_state_indices"),
    ("batch", "dim"), conv1d_update_dims, "mamba_tune.conv1d.update:causal_conv1d_update_kernel")


# --- gated norm ---------------------------------------------------------------------------

def norm_dims(shape: ModelShape) -> dict[str, int]:
    """The call the Mamba-2 mixer makes: RMSNormGated(d_ssm, group_size=d_ssm // ngroups,
    norm_before_gate=False) on (batch * seqlen) rows, z gate, no bias, the weight's dtype
    from `shape.norm_weight_fp32`."""
    d = shape.nheads * shape.headdim
    return {"rows": shape.batch * shape.seqlen, "d": d, "group_size": d // shape.ngroups, "has_z": 1,
            "norm_before_gate": 0, "has_bias": 0, "is_rms": 1, "weight_fp32": int(shape.norm_weight_fp32)}


_NORM_DIMS = ("rows", "d", "group_size", "has_z", "norm_before_gate", "has_bias", "is_rms", "weight_fp32")
# The weight's dtype changes one small load, not the config space (the same structural
# fingerprint: tests/tuner/test_warm_start.py): an entry for one weight dtype serves the other where
# it has none (runtime's nearest rule), and a search for one may start from the other's. A
# bf16-weight search seeded from the fp32-weight entry ended on that entry's very config at
# Nano TP1 on the H200 (0.191 ms, default 0.299 ms).
_NORM_NEUTRAL = ("weight_fp32",)
GATED_NORM_FWD = KernelKey("gated_norm_fwd", "norm", _NORM_DIMS, ("rows",), norm_dims,
                           "mamba_tune.norm.gated:gated_norm_fwd_kernel", neutral_dims=_NORM_NEUTRAL)
GATED_NORM_BWD = KernelKey("gated_norm_bwd", "norm", _NORM_DIMS, ("rows",), norm_dims,
                           "mamba_tune.norm.gated:gated_norm_bwd_kernel", neutral_dims=_NORM_NEUTRAL)


def _by_name() -> dict[str, KernelKey]:
    """Every KernelKey declared above, by name, sorted."""
    declared = [v for v in globals().values() if isinstance(v, KernelKey)]
    named = {k.name: k for k in declared}
    if len(named) != len(declared):
        raise ValueError("two kernel keys share a name")
    return dict(sorted(named.items()))


_BY_NAME = _by_name()


def all_keys() -> dict[str, KernelKey]:
    """Name -> key, sorted by name: every tunable kernel."""
    return dict(_BY_NAME)


def get(name: str) -> KernelKey:
    if name not in _BY_NAME:
        raise KeyError(f"unknown kernel {name!r}; known: {', '.join(_BY_NAME)}")
    return _BY_NAME[name]
