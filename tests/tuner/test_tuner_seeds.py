"""The search's starting points: the warm start (autotune_cli.warm_start) first, then the kernel's seeds."""

from __future__ import annotations

import helion

from autotune_cli.tuner import fitting_seeds
from autotune_cli.tuning import all_kernels
from autotune_cli.tuning.norm import GATED_NORM_BWD
from autotune_cli.warm_start import seed_configs

DIMS = dict(rows=16384, d=4096, group_size=512, has_z=1, norm_before_gate=0, has_bias=0, is_rms=1, weight_fp32=1)


def test_warm_start_comes_first_then_the_kernels_seeds():
    warm = [{"block_sizes": [32, 1, 2], "num_warps": 8}, {"block_sizes": [16, 1, 2], "num_warps": 4}]
    seeds = seed_configs(GATED_NORM_BWD, DIMS, warm)
    assert all(isinstance(s, helion.Config) for s in seeds)
    assert [dict(s) for s in seeds[:2]] == warm
    assert [dict(s) for s in seeds[2:]] == GATED_NORM_BWD.seed_configs(DIMS)
    # A warm config equal to one of the kernel's seeds is tried once.
    own = GATED_NORM_BWD.seed_configs(DIMS)
    assert [dict(s) for s in seed_configs(GATED_NORM_BWD, DIMS, own[:1])] == own
    assert [dict(s) for s in seed_configs(GATED_NORM_BWD, DIMS, None)] == GATED_NORM_BWD.seed_configs(DIMS)


def test_every_kernel_has_seeds_at_a_real_shape():
    # The sweep's quick budgets rely on them; lowering.main checks each one lowers.
    from autotune_cli.lowering import SEED_SHAPES, shapes_for

    for tk in all_kernels().values():
        (shape, *_) = shapes_for(tk, SEED_SHAPES)
        dims = tk.dims_to_check(shape)
        assert tk.seed_configs is not None and tk.seed_configs(dims), tk.name



def test_a_seed_from_another_version_of_the_kernel_is_dropped(capsys):
    # An entry tuned before a change to the kernel (a loop, so loads, gone) has lists of the
    # old lengths; Helion 1.5.0's search fails on such a seed instead of skipping it.
    default = helion.Config(block_sizes=[64, 64, 32, 64], indexing=["pointer"] * 19, num_warps=4)
    fits = helion.Config(block_sizes=[32, 64, 32, 64], indexing=["tensor_descriptor"] * 19, num_stages=2)
    stale = helion.Config(block_sizes=[64, 64, 32, 64], indexing=["pointer"] * 24, num_warps=4)
    assert fitting_seeds([stale, fits], default) == [fits]
    assert "indexing of another length" in capsys.readouterr().err
    assert fitting_seeds([fits], default) == [fits]


def test_each_search_starts_from_the_compile_timeout_the_process_began_with():
    # A kernel's settings are shared by all its bound shapes, and Helion's adaptive timeout
    # lowers them in a search: a warm worker's next search must not inherit that.
    from autotune_cli.tuner import restore_compile_timeout

    settings = GATED_NORM_BWD.kernel.settings
    began = settings.autotune_compile_timeout
    try:
        restore_compile_timeout(settings)
        assert settings.autotune_compile_timeout == began
        settings.autotune_compile_timeout = 7  # what an adaptive timeout leaves behind
        restore_compile_timeout(settings)
        assert settings.autotune_compile_timeout == began
    finally:
        settings.autotune_compile_timeout = began
