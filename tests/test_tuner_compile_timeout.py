"""The search's compile timeout follows the default config's compile (autotune_cli.tuner)."""

import pytest

from autotune_cli.tuner import COMPILE_TIMEOUT_FACTOR, COMPILE_TIMEOUT_MAX_S, compile_timeout_for


@pytest.mark.parametrize("current,first_call,expected", [
    (60, 2.0, 60),                     # a quick compile keeps Helion's timeout
    (60, 12.0, 60),                    # 5 x 12 s is Helion's 60 s
    (60, 20.3, 102),                    # a slow one raises it, rounded up
    (60, 500.0, COMPILE_TIMEOUT_MAX_S),  # never past the cap
    (120, 10.0, 120),                  # a timeout set higher by the user stays
])
def test_the_timeout_is_the_larger_of_helions_and_the_default_compile_times_the_factor(current, first_call, expected):
    assert COMPILE_TIMEOUT_FACTOR == 5
    assert compile_timeout_for(current, first_call) == expected
