"""Helion ref mode (HELION_INTERPRET=1) on CPU tensors: what helion 1.5.0 lacks.

In ref mode a kernel body runs eagerly, as PyTorch ops on the call's tensors: the way to
run the kernels without a GPU (tests, `mamba-tune sweep --cpu-dry-run`).

helion 1.5.0's ref-mode `hl.dot` calls `torch.mm(..., out_dtype=...)`, which has no CPU
kernel. `install_cpu_dot` (run when the SSD kernels are imported) replaces it for CPU
operands with what a tensor-core dot with fp32 accumulation computes: an fp32 matmul of
the operands (products of bf16/fp16 numbers are exact in fp32). fp64 operands stay fp64,
so fp64 gradient checks stay fp64. Other devices, and dtypes a tensor core does not take
as floats (fp8, integers), keep Helion's own implementation.

A call that fails while Helion enters its ref-mode context (on meta tensors its RNG
snapshot raises after the context is half entered) leaves that context active: every
later call in the process fails with "RefModeContext already active", and `torch.zeros`
lands on the failed call's device. `leave_ref_mode_context` undoes what was entered; the
runtime calls it when a ref-mode call fails.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import helion.language as hl
import torch

log = logging.getLogger("mamba_tune")

# The parameters of helion 1.5.0's ref-mode dot, which Helion calls positionally.
_DOT_PARAMS = ("mat1", "mat2", "acc", "out_dtype")
_LOW_PRECISION = (torch.float16, torch.bfloat16, torch.float32)


class _CpuDot:
    """Helion's ref-mode `hl.dot` with a CPU path (see the module docstring)."""

    def __init__(self, helion_dot: Callable[..., torch.Tensor]) -> None:
        self.helion_dot = helion_dot

    def __call__(self, mat1: torch.Tensor, mat2: torch.Tensor, acc: torch.Tensor | None = None,
                 out_dtype: torch.dtype | None = None) -> torch.Tensor:
        dtypes = (mat1.dtype, mat2.dtype)
        if mat1.device.type != "cpu" or not all(d in (*_LOW_PRECISION, torch.float64) for d in dtypes):
            return self.helion_dot(mat1, mat2, acc, out_dtype)
        compute = torch.float64 if torch.float64 in dtypes else torch.float32
        # matmul broadcasts a 3-d operand against a 2-d one, as Helion's bmm path does.
        result = torch.matmul(mat1.to(compute), mat2.to(compute))
        if acc is not None:
            return acc + result.to(out_dtype or acc.dtype)
        return result.to(out_dtype or compute)


def _helion_dot_ref() -> Callable[..., Any] | str:
    """helion's ref-mode dot, or why it cannot be replaced (this Helion changed it)."""
    ref = getattr(hl.dot, "_ref_fn", None)
    if not callable(ref):
        return "hl.dot has no ref-mode implementation attribute (_ref_fn)"
    if isinstance(ref, _CpuDot):
        return ref
    try:
        params = tuple(inspect.signature(ref).parameters)
    except (TypeError, ValueError):
        params = ()
    if params != _DOT_PARAMS:
        return f"hl.dot's ref-mode implementation takes {params}, not {_DOT_PARAMS}"
    return ref


def install_cpu_dot() -> bool:
    """Give Helion's ref-mode `hl.dot` a CPU path; idempotent. False (and a log line) when
    this Helion's dot is not the one this was written for: ref-mode dots on CPU tensors
    then fail as Helion's own do."""
    ref = _helion_dot_ref()
    if isinstance(ref, str):
        log.info("mamba_tune.ref_mode: not installing the CPU ref-mode dot: %s", ref)
        return False
    if not isinstance(ref, _CpuDot):
        hl.dot._ref_fn = _CpuDot(ref)
    return True


def cpu_dot_installed() -> bool:
    return isinstance(getattr(hl.dot, "_ref_fn", None), _CpuDot)


def ref_mode_context() -> object | None:
    """Helion's active ref-mode context on this thread, if any."""
    from helion.runtime.ref_mode import ref_mode_tls

    return getattr(ref_mode_tls, "context", None)


def leave_ref_mode_context(before: object = None) -> None:
    """Exit a Helion ref-mode context that a failed call left active, unless it is `before`
    (the context that was active when the call started, normally None).

    helion 1.5.0's `RefModeContext.__enter__` registers the context and enters the
    call's default device before it takes an RNG snapshot and enters its torch function
    mode; when the snapshot raises (meta tensors), `__exit__` never runs. What was
    entered is undone here, in reverse order.
    """
    from helion._compiler.compile_environment import tls as env_tls
    from helion.runtime.ref_mode import ref_mode_tls
    from torch.overrides import _get_current_function_mode_stack

    context = getattr(ref_mode_tls, "context", None)
    if context is None or context is before:
        return
    if any(mode is context.func_mode for mode in _get_current_function_mode_stack()):
        context.__exit__(None, None, None)
        return
    context.device_ctx.__exit__(None, None, None)
    ref_mode_tls.context = None
    env_tls.env = None
