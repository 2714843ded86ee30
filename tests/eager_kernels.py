"""Helion kernels run eagerly (ref mode) on CPU tensors for one block, whatever HELION_INTERPRET said
when they were created, with a rule for `hl.register_block_size` (ref mode's own gives every one
its largest value: one tile per loop, so the multi-tile paths would never run). The conv1d, SSD
and layer fixtures and the experiments' tests use it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import helion.language as hl
from helion.runtime.ref_mode import RefMode

from mamba_tune import runtime


def smallest_block(min_or_max: int, max_or_none: int | None = None, /) -> int:
    """register_block_size(max) allows 1; register_block_size(min, max) allows min."""
    return 1 if max_or_none is None else min_or_max


@contextlib.contextmanager
def eager_kernels(kernels: Sequence[Any], block_rule: Callable[..., int] | None = None) -> Iterator[None]:
    """`kernels` in eager ref mode, `hl.register_block_size` by `block_rule` (None: ref mode's
    choice) for as long as the block lasts; the runtime drops callables compiled in the other mode
    on the way in and out."""
    saved = [k.settings.ref_mode for k in kernels]
    saved_block_ref = hl.register_block_size._ref_fn
    if block_rule is not None:
        hl.register_block_size._ref_fn = block_rule
    for k in kernels:
        k.settings.ref_mode = RefMode.EAGER
        k.reset()
    runtime.configure()
    try:
        yield
    finally:
        hl.register_block_size._ref_fn = saved_block_ref
        for k, mode in zip(kernels, saved, strict=True):
            k.settings.ref_mode = mode
            k.reset()
        runtime.configure()
