"""The torch-free key records (autotune_cli/kernel_keys.py) agree with the kernels.

`plan`, `validate` and `check` read each kernel's key dims and `dims_for` from
`kernel_keys` so that they start without torch and helion; the kernels' runtime
declarations and the tuning records hold the same facts. Any drift fails here.
"""

from __future__ import annotations

import itertools

import pytest

from autotune_cli.presets import MODEL_PRESETS
from autotune_cli.tuning import all_kernels
from mamba_tune.keys import ModelShape, all_keys


def _shapes() -> list[ModelShape]:
    shapes = []
    for m in MODEL_PRESETS.values():
        for tp, batch, seqlen, packed in itertools.product((1, 2, 8), (1, 2), (8192, 4000, 100), (False, True)):
            if m.nheads % tp or m.ngroups % tp:
                continue
            shapes.append(ModelShape(batch=batch, seqlen=seqlen, nheads=m.nheads // tp, headdim=m.headdim,
                                     ngroups=m.ngroups // tp, dstate=m.dstate, chunk_size=m.chunk_size,
                                     packed=packed))
    return shapes


def test_the_same_kernels():
    assert list(all_keys()) == list(all_kernels())


@pytest.mark.parametrize("name", sorted(all_kernels()))
def test_dims_and_dims_for_agree_with_the_kernel(name):
    key, tk = all_keys()[name], all_kernels()[name]
    assert (key.family, key.dims) == (tk.family, tk.dims)
    shapes = _shapes()
    assert len(shapes) > 50
    for shape in shapes:
        dims = key.dims_for(shape)
        assert dims == tk.dims_for(shape), shape
        assert dims is None or tuple(dims) == key.dims


@pytest.mark.parametrize("name", sorted(all_kernels()))
def test_source_hash_without_import_is_the_kernels(name):
    key, tk = all_keys()[name], all_kernels()[name]
    fn = getattr(tk.kernel, "fn", tk.kernel)
    assert key.source == f"{fn.__module__}:{fn.__name__}"
    assert key.source_sha256() == tk.source_sha256()


def test_bench_config_modes_are_the_runtime_modes():
    from autotune_cli.benchmarks.cli import ConfigMode
    from mamba_tune.runtime import Mode

    assert [m.value for m in ConfigMode] == [m.value for m in Mode]
