"""Tuning records of the causal conv1d (`kernels/conv1d/`): inputs, the fp32 check, baselines, seeds.

The Mamba-2 layer runs the conv over xBC (dim = d_inner + 2 * ngroups * dstate, width =
d_conv) in the channel-last layout, with bias and SiLU, and with seq_idx for packed
sequences (`mamba_tune.keys.conv1d_fwd_dims`); its decode step takes one
position per row with a (batch, dim, d_conv) state (`conv1d_update_dims`). The baseline is the causal-conv1d
package where it is importable (a CUDA extension many installs lack), else eager torch
(`F.conv1d`, and autograd through it for the backward); the baseline's name says which.

The baselines call the package's functions that mamba-ssm's fused layer calls
(`causal_conv1d.cpp_functions`), not `causal_conv1d_fn`'s autograd, whose engine adds its own time.
The layer's backward (channel-last) is one kernel, `causal_conv1d_bwd_slide`, whose baseline
is the package's whole backward. Other layouts run two kernels: `causal_conv1d_bwd` (dpre =
dout * silu'(pre), fp32, with dweight and dbias) and `causal_conv1d_bwd_dx` (dx and
dinitial_states from dpre). The first one's baseline is the package's whole backward (dx
included: the sum of both kernels' times is what compares with it); the second has none (no
library runs that stencil alone). No model layer plans the two (`tune` still takes them).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import torch
import torch.nn.functional as F

from autotune_cli.reference import causal_conv1d_ref, causal_conv1d_update_ref
from autotune_cli.tuning.record import Baseline, Problem, TunableKernel
from mamba_tune.conv1d import bwd, bwd_slide, common, fwd, update


class ConvInputs:
    """Seeded inputs of one conv problem (missing flags: off), in the layout the dims name."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        batch, seqlen, dim, width = dims["batch"], dims["seqlen"], dims["dim"], dims["width"]

        def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

        def seq(*shape: int) -> torch.Tensor:  # (batch, dim, seqlen) in the dims' layout
            if dims.get("channel_last", 0):
                return rand(shape[0], shape[2], shape[1]).transpose(1, 2)
            return rand(*shape)

        # row_stride (the layer kernels' key dim): x's rows that many elements apart, as the
        # layer's slice of in_proj's output lies (keys.row_stride).
        self.row_stride = dims.get("row_stride")
        self.shape, self.dtype, self.device = (batch, dim, seqlen), dtype, device
        self.channel_last = bool(dims.get("channel_last", 0))
        row, row_name = (dim, "dim") if self.channel_last else (seqlen, "seqlen")
        if self.row_stride is not None and self.row_stride < row:
            raise ValueError(f"row_stride {self.row_stride} < the {row} elements of a row ({row_name})")

        self.width = width
        self.silu = bool(dims.get("silu", 0))
        self.x = seq(batch, dim, seqlen) if self.row_stride is None else self.like_x().copy_(seq(batch, dim, seqlen))
        # Mamba-2's conv init: uniform with bound 1/sqrt(width); here Gaussian of that scale.
        self.weight = rand(dim, width, scale=width ** -0.5)
        self.bias = rand(dim, scale=0.1) if dims.get("has_bias", 0) else None
        self.seq_idx = None
        if dims.get("has_seq_idx", 0):
            # Three packed sequences per row at random boundaries.
            cuts = torch.sort(torch.randint(1, max(2, seqlen), (batch, 2), generator=gen), dim=1).values
            pos = torch.arange(seqlen)
            self.seq_idx = ((pos >= cuts[:, :1]).int() + (pos >= cuts[:, 1:]).int()).to(torch.int32).to(device)
        self.initial_states = rand(batch, dim, width - 1) if dims.get("has_initial_states", 0) else None
        self.dout = seq(batch, dim, seqlen)
        self.dfinal = rand(batch, dim, width - 1) if dims.get("has_dfinal", 0) else None
        self.want_dinit = bool(dims.get("has_dinitial_states", 0)) and self.initial_states is not None

    def like_x(self) -> torch.Tensor:
        """An empty (batch, dim, seqlen) tensor in x's layout: with row_stride, a slice of a wider
        buffer whose rows (positions channel-last, else channels) are that many elements apart."""
        if self.row_stride is None:
            return common.like(self.x)
        batch, dim, seqlen = self.shape
        if self.channel_last:
            buf = torch.empty(batch, seqlen, self.row_stride, dtype=self.dtype, device=self.device)
            return buf[..., :dim].transpose(1, 2)
        buf = torch.empty(batch, dim, self.row_stride, dtype=self.dtype, device=self.device)
        return buf[..., :seqlen]

    def ref(self, upcast: bool) -> dict[str, torch.Tensor]:
        out, _final = causal_conv1d_ref(self.x, self.weight, self.bias, self.seq_idx, self.initial_states,
                                        "silu" if self.silu else None, upcast=upcast)
        return {"out": out.float()}

    def dpre(self, upcast: bool) -> torch.Tensor:
        """dout * silu'(pre) (dout without SiLU) of the reference, 0 at padding positions
        (their output is a constant 0), as float32."""
        # pre in fp32 for the fp32 reference (causal_conv1d_ref returns its input's dtype: given
        # bf16 inputs, dpre would be rounded to bf16, and a kernel that keeps it in fp32 would
        # be measured against a rounded reference).
        cast = (lambda t: None if t is None else t.float()) if upcast else (lambda t: t)
        pre, _final = causal_conv1d_ref(cast(self.x), cast(self.weight), cast(self.bias), self.seq_idx,
                                        cast(self.initial_states), None, upcast=upcast)
        dout = self.dout.float() if upcast else self.dout.to(pre.dtype)
        if self.silu:
            pre = pre.detach().requires_grad_()
            with torch.enable_grad():
                (dpre,) = torch.autograd.grad(F.silu(pre), [pre], dout)
        else:
            dpre = dout
        if self.seq_idx is not None:
            dpre = dpre * (self.seq_idx >= 0)[:, None].to(dpre.dtype)
        return dpre.float()

    def grads(self, upcast: bool) -> dict[str, torch.Tensor]:
        """Gradients of the reference (fp32, or eager torch in the inputs' dtype)."""
        leaves = {"dx": self.x, "dweight": self.weight}
        if self.bias is not None:
            leaves["dbias"] = self.bias
        if self.want_dinit:
            leaves["dinitial_states"] = self.initial_states
        cast = (lambda t: t.float()) if upcast else (lambda t: t)
        req = {k: cast(v).detach().requires_grad_() for k, v in leaves.items()}
        init = req.get("dinitial_states", None if self.initial_states is None else cast(self.initial_states))
        with torch.enable_grad():
            out, final = causal_conv1d_ref(req["dx"], req["dweight"], req.get("dbias"), self.seq_idx, init,
                                           "silu" if self.silu else None, upcast=upcast)
            outs, grads_out = [out], [cast(self.dout).to(out.dtype)]
            if self.dfinal is not None:
                outs.append(final)
                grads_out.append(cast(self.dfinal).to(final.dtype))
            grads = torch.autograd.grad(outs, list(req.values()), grads_out)
        return {k: g.float() for k, g in zip(req, grads, strict=True)}


def _bytes(inp: ConvInputs, n_seq: int) -> int:
    """Bytes of n_seq (batch, dim, seqlen) tensors, plus seq_idx."""
    x = inp.x
    return n_seq * x.numel() * x.element_size() + (0 if inp.seq_idx is None else inp.seq_idx.numel() * 4)


def _make_fwd_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    inp = ConvInputs(dims, dtype, device, seed)
    out = common.like(inp.x)
    args = (inp.x, inp.weight, inp.bias, inp.seq_idx, inp.initial_states, out, inp.width, inp.silu)
    return Problem(
        args=args,
        reference=lambda: inp.ref(upcast=True),
        lowp_reference=lambda: inp.ref(upcast=False),
        outputs=lambda res: {"out": res.float()},
        bytes_moved=_bytes(inp, 2),
        flops=2 * inp.x.numel() * inp.width,
    )


def _make_bwd_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    inp = ConvInputs(dims, dtype, device, seed)
    dpre = common.like(inp.x, torch.float32)
    args = (inp.x, inp.weight, inp.bias, inp.dout, inp.seq_idx, inp.initial_states, dpre, inp.width, inp.silu)

    def outputs(res: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        got = {"dpre": res[0], "dweight": res[1].t().float()}
        if inp.bias is not None:
            got["dbias"] = res[2].float()
        return got

    def reference(upcast: bool) -> dict[str, torch.Tensor]:
        grads = inp.grads(upcast)
        ref = {"dpre": inp.dpre(upcast), "dweight": grads["dweight"]}
        if inp.bias is not None:
            ref["dbias"] = grads["dbias"]
        return ref

    n = inp.x.numel()
    return Problem(
        args=args,
        reference=lambda: reference(True),
        lowp_reference=lambda: reference(False),
        outputs=outputs,
        # x and dout read, dpre (fp32) written.
        bytes_moved=_bytes(inp, 2) + 4 * n,
        flops=(4 * inp.width + (6 if inp.silu else 0)) * n,
    )


def _make_bwd_slide_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    inp = ConvInputs(dims, dtype, device, seed)
    dx = inp.like_x()  # the layer writes dx into its slice of the input gradient, laid out as x
    dinit = common.dinit_buffer(inp.initial_states) if inp.want_dinit else None
    args = (inp.x, inp.weight, inp.bias, inp.dout, inp.seq_idx, inp.initial_states, inp.dfinal, dx, dinit,
            inp.width, inp.silu)

    def outputs(res: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        got = {"dx": res[0].float(), "dweight": res[1].t().float()}
        if inp.bias is not None:
            got["dbias"] = res[2].float()
        if dinit is not None:
            got["dinitial_states"] = dinit[:, :, :inp.width - 1].float()
        return got

    n = inp.x.numel()
    return Problem(
        args=args,
        reference=lambda: inp.grads(upcast=True),
        lowp_reference=lambda: inp.grads(upcast=False),
        outputs=outputs,
        # x and dout read, dx written.
        bytes_moved=_bytes(inp, 3),
        flops=(6 * inp.width + (6 if inp.silu else 0)) * n,
    )


def _make_bwd_dx_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    # The inputs' initial states only give dinitial_states its shape (the conv is linear in them).
    inp = ConvInputs({**dims, "has_initial_states": dims["has_dinitial_states"]}, dtype, device, seed)
    # dpre as the first kernel writes it (the dims name no SiLU: dout in fp32, 0 at padding).
    dpre = common.like(inp.x, torch.float32)
    dpre.copy_(inp.dpre(upcast=True))
    dx = common.like(inp.x)
    dinit = common.dinit_buffer(inp.initial_states) if inp.want_dinit else None
    args = (dpre, inp.weight, inp.seq_idx, inp.dfinal, dx, dinit, inp.width)

    def outputs(res: torch.Tensor) -> dict[str, torch.Tensor]:
        got = {"dx": res.float()}
        if dinit is not None:
            got["dinitial_states"] = dinit[:, :, :inp.width - 1].float()
        return got

    def reference(upcast: bool) -> dict[str, torch.Tensor]:
        """Gradients of the conv without bias and activation (linear: any x gives them) for
        an output gradient of dpre, in fp32 or eager in the inputs' dtype."""
        cast = (lambda t: t.float()) if upcast else (lambda t: t.to(dtype))
        x = torch.zeros_like(cast(inp.x)).requires_grad_()
        leaves = [x]
        init = None
        if dinit is not None:
            init = torch.zeros_like(cast(inp.initial_states)).requires_grad_()
            leaves.append(init)
        with torch.enable_grad():
            out, final = causal_conv1d_ref(x, inp.weight, None, inp.seq_idx, init, None, upcast=upcast)
            outs, grads_out = [out], [cast(dpre)]
            if inp.dfinal is not None:
                outs.append(final)
                grads_out.append(cast(inp.dfinal))
            grads = torch.autograd.grad(outs, leaves, grads_out)
        ref = {"dx": grads[0].float()}
        if dinit is not None:
            ref["dinitial_states"] = grads[1].float()
        return ref

    n = inp.x.numel()
    return Problem(
        args=args,
        reference=lambda: reference(True),
        lowp_reference=lambda: reference(False),
        outputs=outputs,
        # dpre (fp32) read, dx written.
        bytes_moved=4 * n + _bytes(inp, 1),
        flops=2 * inp.width * n,
    )


class UpdateInputs:
    """Seeded inputs of one decode step: states in more slots than rows with state indices,
    cache_seqlens at random offsets (the circular buffer wraps)."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int):
        gen = torch.Generator(device="cpu").manual_seed(seed)
        batch, dim, seqlen, width = dims["batch"], dims["dim"], dims["seqlen"], dims["width"]
        state_len = dims["state_len"]

        def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

        self.x = rand(batch, dim, seqlen)
        nslots = batch + 2 if dims.get("has_state_indices", 0) else batch
        # The layout of mamba-ssm's inference cache: (batch, d_conv, dim) transposed.
        self.state0 = rand(nslots, state_len, dim).transpose(1, 2)
        self.weight = rand(dim, width, scale=width ** -0.5)
        self.bias = rand(dim, scale=0.1) if dims.get("has_bias", 0) else None
        self.activation = "silu" if dims.get("silu", 0) else None
        self.cache_seqlens = (torch.randint(0, 4 * state_len, (batch,), generator=gen).to(torch.int32).to(device)
                              if dims.get("has_cache_seqlens", 0) else None)
        self.indices = None
        if dims.get("has_state_indices", 0):
            indices = torch.randperm(nslots, generator=gen)[:batch].to(torch.int32)
            if batch > 1:
                indices[-1] = -1  # a padding slot
            self.indices = indices.to(device)

    def ref(self) -> dict[str, torch.Tensor]:
        state = self.state0.transpose(1, 2).clone().transpose(1, 2)
        out = causal_conv1d_update_ref(self.x, state, self.weight, self.bias, self.activation, self.cache_seqlens,
                                       self.indices)
        return {"out": out.float(), "conv_state": state.float()}


def _make_update_problem(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Problem:
    inp = UpdateInputs(dims, dtype, device, seed)
    # The kernel updates the state in place: it runs on a copy, the references on the original.
    # (Without cache_seqlens each run shifts the state: the problem checks the first run.)
    state = inp.state0.transpose(1, 2).clone().transpose(1, 2)
    args = (inp.x, state, inp.weight, inp.bias, inp.cache_seqlens, inp.indices, torch.empty_like(inp.x),
            inp.weight.shape[1], inp.activation is not None)
    return Problem(
        args=args,
        # The step is fp32 arithmetic on values it copies: one reference serves both bounds.
        reference=inp.ref,
        lowp_reference=inp.ref,
        outputs=lambda res: {"out": res.float(), "conv_state": state.float()},
        bytes_moved=2 * inp.x.numel() * inp.x.element_size() + 2 * state[: inp.x.shape[0]].numel()
        * state.element_size(),
    )


# --- baselines --------------------------------------------------------------------------


def _layer_functions() -> tuple[Any, Any] | None:
    """causal-conv1d's forward and backward functions as mamba-ssm's fused layer calls them
    (`causal_conv1d.cpp_functions`, imported by mamba_ssm.ops.triton.ssd_combined), or None where
    the package predates them. Timed directly: through `causal_conv1d_fn`'s autograd the backward
    timed 0.219 ms at Zamba2-2.7B batch 4 x 2048 on an H100, the function alone 0.149 ms."""
    try:
        from causal_conv1d.cpp_functions import (
            causal_conv1d_bwd_function,
            causal_conv1d_fwd_function,
        )
    except ImportError:
        return None
    return causal_conv1d_fwd_function, causal_conv1d_bwd_function


def causal_conv1d_package() -> tuple[Any, str] | None:
    """The causal-conv1d package (its Python API) and its name with version, or None."""
    try:
        import causal_conv1d
    except ImportError:
        return None
    try:
        version = importlib.metadata.version("causal_conv1d")
    except importlib.metadata.PackageNotFoundError:
        version = getattr(causal_conv1d, "__version__", "?")
    return causal_conv1d, f"causal-conv1d {version}"


TORCH_BASELINE = f"torch {torch.__version__} F.conv1d (causal-conv1d not installed)"


def _baseline_fwd(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    if device.type != "cuda":
        return None
    inp = ConvInputs(dims, dtype, device, seed)
    act = "silu" if inp.silu else None
    found = causal_conv1d_package()
    if found is not None:
        pkg, name = found
        if (layer_fns := _layer_functions()) is not None:
            fwd_fn = layer_fns[0]
            return Baseline(f"{name} {fwd_fn.__name__}",
                            lambda: fwd_fn(inp.x, inp.weight, inp.bias, inp.seq_idx, inp.initial_states, None,
                                           inp.silu))
        return Baseline(name, lambda: pkg.causal_conv1d_fn(inp.x, inp.weight, inp.bias, inp.seq_idx,
                                                            inp.initial_states, activation=act))
    return Baseline(TORCH_BASELINE, lambda: causal_conv1d_ref(inp.x, inp.weight, inp.bias, inp.seq_idx,
                                                              inp.initial_states, act, upcast=False))


def _baseline_bwd(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    if device.type != "cuda":
        return None
    inp = ConvInputs(dims, dtype, device, seed)
    act = "silu" if inp.silu else None
    found = causal_conv1d_package()
    if found is not None and (layer_fns := _layer_functions()) is not None:
        bwd_fn = layer_fns[1]
        # The whole backward (dx too): compare it with both kernels' times together.
        return Baseline(f"{found[1]} {bwd_fn.__name__}, whole backward (dx too)",
                        lambda: bwd_fn(inp.x, inp.weight, inp.bias, inp.dout, inp.seq_idx, inp.initial_states,
                                       inp.dfinal, None, inp.want_dinit, inp.silu))
    x = inp.x.detach().requires_grad_()
    weight = inp.weight.detach().requires_grad_()
    leaves = [x, weight]
    bias = None
    if inp.bias is not None:
        bias = inp.bias.detach().requires_grad_()
        leaves.append(bias)
    name = TORCH_BASELINE
    with torch.enable_grad():
        if found is not None:
            pkg, name = found
            out = pkg.causal_conv1d_fn(x, weight, bias, inp.seq_idx, inp.initial_states, activation=act)
        else:
            out, _ = causal_conv1d_ref(x, weight, bias, inp.seq_idx, inp.initial_states, act, upcast=False)

    # The backward alone: the graph is built once and kept.
    def fn() -> Any:
        return torch.autograd.grad(out, leaves, inp.dout, retain_graph=True)

    # The whole backward (dx too): compare it with both kernels' times together.
    return Baseline(f"{name}, whole backward (dx too)", fn)


def _baseline_update(dims: dict[str, int], dtype: torch.dtype, device: torch.device, seed: int) -> Baseline | None:
    if device.type != "cuda":
        return None
    inp = UpdateInputs(dims, dtype, device, seed)
    state = inp.state0.transpose(1, 2).clone().transpose(1, 2)
    found = causal_conv1d_package()
    if found is not None:
        pkg, name = found
        return Baseline(name, lambda: pkg.causal_conv1d_update(inp.x, state, inp.weight, inp.bias, inp.activation,
                                                               inp.cache_seqlens, inp.indices))
    return Baseline(f"torch {torch.__version__} reference loop (causal-conv1d not installed)",
                    lambda: causal_conv1d_update_ref(inp.x, state, inp.weight, inp.bias, inp.activation,
                                                     inp.cache_seqlens, inp.indices))


# --- seeds ------------------------------------------------------------------------------

# (channels, positions, warps): wide along the unit-stride axis, 1-8K elements per program.
_CHANNEL_LAST_TILES = ((128, 32, 4), (64, 64, 4), (128, 64, 8), (256, 16, 4), (32, 128, 4))
_CONTIGUOUS_TILES = ((8, 256, 4), (4, 512, 4), (16, 128, 4), (2, 1024, 8), (32, 64, 4))


def _tiles(dims: dict[str, int]) -> tuple[tuple[int, int, int], ...]:
    return _CHANNEL_LAST_TILES if dims["channel_last"] else _CONTIGUOUS_TILES


def _unique(configs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    seeds: list[dict[str, Any]] = []
    for c in configs:
        if c not in seeds:
            seeds.append(c)
    return seeds


def _fwd_seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    return _unique([fwd.CAUSAL_CONV1D_FWD.default_config(dims)]
                   + [fwd.fwd_config(dims, bd, bl, w) for bd, bl, w in _tiles(dims)])


def _bwd_seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    # Half the forward's tiles (the backward holds more at once), 512-2048 positions per program.
    tiles = [(bd, max(1, bl // 2), w) for bd, bl, w in _tiles(dims)]
    return _unique([bwd.CAUSAL_CONV1D_BWD.default_config(dims)]
                   + [bwd.bwd_config(dims, bd, bl, w, chunk) for (bd, bl, w), chunk
                      in zip(tiles, (1024, 2048, 512, 1024, 2048), strict=True)])


def _bwd_slide_seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    return _unique([bwd_slide.CAUSAL_CONV1D_BWD_SLIDE.default_config(dims)]
                   + [bwd_slide.slide_config(dims, *seed) for seed in bwd_slide.SEEDS])


def _bwd_dx_seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    # A stencil like the forward: the forward's tiles.
    return _unique([bwd.CAUSAL_CONV1D_BWD_DX.default_config(dims)]
                   + [fwd.fwd_config(dims, bd, bl, w) for bd, bl, w in _tiles(dims)])


def _update_seeds(dims: dict[str, int]) -> list[dict[str, Any]]:
    return _unique([update.CAUSAL_CONV1D_UPDATE.default_config(dims)]
                   + [update.config(bd, w) for bd, w in ((64, 2), (256, 4), (512, 8))])


CAUSAL_CONV1D_FWD = TunableKernel(
    runtime=fwd.CAUSAL_CONV1D_FWD,
    make_problem=_make_fwd_problem,
    make_baseline=_baseline_fwd,
    seed_configs=_fwd_seeds,
    description="causal depthwise conv1d forward (causal-conv1d causal_conv1d_fwd)",
)

CAUSAL_CONV1D_BWD_SLIDE = TunableKernel(
    runtime=bwd_slide.CAUSAL_CONV1D_BWD_SLIDE,
    make_problem=_make_bwd_slide_problem,
    make_baseline=_baseline_bwd,
    seed_configs=_bwd_slide_seeds,
    description="causal depthwise conv1d backward of channel-last calls in one kernel: dx, dweight, dbias, "
                "dinitial_states (causal-conv1d causal_conv1d_bwd)",
)

CAUSAL_CONV1D_BWD = TunableKernel(
    runtime=bwd.CAUSAL_CONV1D_BWD,
    make_problem=_make_bwd_problem,
    make_baseline=_baseline_bwd,
    seed_configs=_bwd_seeds,
    description="causal depthwise conv1d backward, first kernel: dpre = dout * silu'(pre) (fp32), dweight, dbias "
                "(with causal_conv1d_bwd_dx: causal-conv1d causal_conv1d_bwd)",
)

CAUSAL_CONV1D_BWD_DX = TunableKernel(
    runtime=bwd.CAUSAL_CONV1D_BWD_DX,
    make_problem=_make_bwd_dx_problem,
    make_baseline=None,  # no library runs this stencil alone (causal_conv1d_bwd's baseline is the whole backward)
    seed_configs=_bwd_dx_seeds,
    description="causal depthwise conv1d backward, second kernel: dx, dinitial_states from dpre",
)

CAUSAL_CONV1D_UPDATE = TunableKernel(
    runtime=update.CAUSAL_CONV1D_UPDATE,
    make_problem=_make_update_problem,
    make_baseline=_baseline_update,
    seed_configs=_update_seeds,
    description="causal conv1d decode step, conv_state updated in place (causal-conv1d causal_conv1d_update)",
)

KERNELS = (CAUSAL_CONV1D_FWD, CAUSAL_CONV1D_BWD_SLIDE, CAUSAL_CONV1D_BWD, CAUSAL_CONV1D_BWD_DX,
           CAUSAL_CONV1D_UPDATE)
