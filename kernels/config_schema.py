"""What a Helion config from a bundle may hold: checked before Helion ever sees it.

Helion pastes some config values into the host code it generates and runs (a string
`num_warps` becomes code), and Triton fails at the first launch on others (3 warps, a
2**40 block). So a bundle's config is data of a closed form, checked in two steps:

1. `schema_problem`, torch-free (the bundle model runs it on every load, so `validate`,
   `merge`, `diff`, `check` and the run-time loader all refuse a bad value): only the keys
   the Triton backend tunes, each an int, bool, None, one of Helion's string enums, or a
   short list of those, in the range Helion 1.5.0 accepts (its search fragments'
   ranges; block sizes capped at Triton's largest tensor).
2. `checked_config`, against one kernel's Helion ConfigSpec where it is at hand (the
   runtime before it compiles, `validate`, `check`): list lengths, the values the
   kernel's config space allows, and Helion's own `ConfigSpec.normalize`.

Each problem is one line: `<field>[<index>]: must be <allowed values>, got <value>`.
"""

from __future__ import annotations

import copy
import dataclasses
import reprlib
from collections.abc import Callable, Mapping
from typing import Any

# The longest list a config holds: one item per load, store or loop of a kernel (the
# shipped bundles' longest, the SSD backward's indexing, has 32).
MAX_LIST = 128
# Triton's largest tensor (TRITON_MAX_TENSOR_NUMEL): no one block may be larger.
MAX_BLOCK = 1 << 20
# Loops a kernel nests in one tile (loop_orders permutes them).
MAX_LOOP_DEPTH = 8

_show = reprlib.Repr()
_show.maxstring = 48
_show.maxother = 48
_show.maxlist = 8


class ConfigError(ValueError):
    """A config value that must not reach Helion; the message is one line."""


def _is_int(v: Any) -> bool:
    return type(v) is int  # not bool, which is an int to Python


def _pow2(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and lo <= v <= hi and v & (v - 1) == 0


def _between(lo: int, hi: int) -> Callable[[Any], bool]:
    return lambda v: _is_int(v) and lo <= v <= hi


def _one_of(*choices: Any) -> Callable[[Any], bool]:
    # Type and value: True is not 1, 2.0 is not 2.
    return lambda v: any(type(v) is type(c) and v == c for c in choices)


def _permutation(v: Any) -> bool:
    return (type(v) is list and 0 < len(v) <= MAX_LOOP_DEPTH and all(_is_int(x) for x in v)
            and sorted(v) == list(range(len(v))))


@dataclasses.dataclass(frozen=True)
class _Value:
    ok: Callable[[Any], bool]
    allowed: str

    def problem(self, where: str, v: Any) -> str | None:
        return None if self.ok(v) else f"{where}: must be {self.allowed}, got {_show.repr(v)}"


@dataclasses.dataclass(frozen=True)
class _List:
    item: _Value
    one_for_all: bool = False  # Helion also takes one value that applies to every item

    def problem(self, where: str, v: Any) -> str | None:
        if self.one_for_all and self.item.ok(v):
            return None
        if type(v) is not list:
            alone = " (or one such value for all)" if self.one_for_all else ""
            return f"{where}: must be a list of {self.item.allowed}{alone}, got {_show.repr(v)}"
        if len(v) > MAX_LIST:
            return f"{where}: must be a list of at most {MAX_LIST} values, got {len(v)}"
        for i, x in enumerate(v):
            if (bad := self.item.problem(f"{where}[{i}]", x)) is not None:
                return bad
        return None


_BLOCK = _Value(_pow2(1, MAX_BLOCK), f"a power of two from 1 to {MAX_BLOCK}")
_OPT_BOOL = _Value(lambda v: v is None or type(v) is bool, "null, true or false")
_BOOL = _Value(lambda v: type(v) is bool, "true or false")
_INDEXING = _Value(_one_of("pointer", "tensor_descriptor", "block_ptr"), "'pointer', 'tensor_descriptor' or 'block_ptr'")

# Key -> its rule: the keys Helion 1.5.0's Triton backend tunes (helion.Config), each in the
# range Helion accepts. Left out on purpose: other backends' keys (cute_*, pallas_*, AMD's),
# and advanced_controls_file, a path that ptxas would read.
RULES: dict[str, _Value | _List] = {
    "block_sizes": _List(_BLOCK),
    "reduction_loops": _List(_Value(lambda v: v is None or _BLOCK.ok(v), f"null or {_BLOCK.allowed}")),
    "loop_orders": _List(_Value(_permutation, f"a permutation of 0..n-1 (n at most {MAX_LOOP_DEPTH})")),
    "flatten_loops": _List(_BOOL),
    "l2_groupings": _List(_Value(_pow2(1, 64), "a power of two from 1 to 64")),
    "range_unroll_factors": _List(_Value(_between(0, 4), "an integer from 0 to 4")),
    "range_num_stages": _List(_Value(_between(0, 4), "an integer from 0 to 4")),
    "range_warp_specializes": _List(_OPT_BOOL),
    "range_multi_buffers": _List(_OPT_BOOL),
    "range_flattens": _List(_OPT_BOOL),
    "static_ranges": _List(_BOOL),
    "num_warps": _Value(_one_of(1, 2, 4, 8, 16, 32), "one of 1, 2, 4, 8, 16, 32"),
    "num_stages": _Value(_between(1, 8), "an integer from 1 to 8"),
    "pid_type": _Value(_one_of("flat", "xyz", "persistent_blocked", "persistent_interleaved"),
                       "'flat', 'xyz', 'persistent_blocked' or 'persistent_interleaved'"),
    "num_sm_multiplier": _Value(_between(1, 128), "an integer from 1 to 128"),
    "maxnreg": _Value(lambda v: v is None or _between(1, 256)(v), "null or an integer from 1 to 256"),
    "indexing": _List(_INDEXING, one_for_all=True),
    "atomic_indexing": _List(_INDEXING, one_for_all=True),
    "load_eviction_policies": _List(_Value(_one_of("", "first", "last"), "'', 'first' or 'last'"), one_for_all=True),
    "load_cache_modifiers": _List(_Value(_one_of("", ".cg"), "'' or '.cg'")),
    "store_cache_modifiers": _List(_Value(_one_of("", ".cs", ".wt"), "'', '.cs' or '.wt'")),
    "host_tensor_descriptors": _BOOL,
    "cross_loop_pipeline": _Value(_one_of("barrier", "static", "dynamic"), "'barrier', 'static' or 'dynamic'"),
    "epilogue_subtile": _Value(lambda v: v is None or _one_of(2, 4)(v), "null, 2 or 4"),
}


def schema_problem(config: Any) -> str | None:
    """Why `config` is not a config a bundle may hold (one line), or None. Torch-free."""
    if not isinstance(config, dict):
        return f"must be a JSON object of Helion config values, got {_show.repr(config)}"
    for key, value in config.items():
        rule = RULES.get(key)
        if rule is None:
            name = key if isinstance(key, str) and key.isidentifier() else _show.repr(key)
            return (f"{name}: not a Helion config key a bundle may set (known: "
                    f"{', '.join(sorted(RULES))})")
        if (bad := rule.problem(key, value)) is not None:
            return bad
    return None


# Keys whose explicit values Helion takes beyond its search fragment (its docs: "explicit
# configurations may use intermediate values"): the schema's range is theirs.
_WIDER_THAN_SEARCH = frozenset({"maxnreg", "num_sm_multiplier"})
# Keys whose choices follow the local device (a CPU's config space has no tensor
# descriptors): their values are the schema's, their list lengths the kernel's. A choice the
# GPU lacks fails its compile there, and the runtime then runs the default config.
_DEVICE_CHOICES = frozenset({"indexing", "atomic_indexing"})


def spec_problem(config: Mapping[str, Any], spec: Any) -> str | None:
    """Why one kernel's Helion ConfigSpec (bound at a shape) does not allow `config`'s
    values (one line), or None. The schema first; then each value against the kernel's
    field for it: list lengths, integer ranges, powers of two, choices."""
    if (bad := schema_problem(config)) is not None:
        return bad
    from helion.autotuner.block_id_sequence import BlockIdSequence

    fields = spec._flat_fields()  # Helion's one list of a config space's fields and their ranges
    for key, value in config.items():
        field = fields.get(key)
        if field is None or isinstance(field, BlockIdSequence) or key in _WIDER_THAN_SEARCH:
            continue  # not this kernel's (normalize drops or refuses it), or normalize checks it
        if (bad := _fragment_problem(key, value, field, key in _DEVICE_CHOICES)) is not None:
            return bad
    return None


def _fragment_problem(where: str, value: Any, frag: Any, device_choices: bool = False) -> str | None:
    from helion.autotuner.config_fragment import (
        BaseIntegerFragment,
        BooleanFragment,
        EnumFragment,
        ListOf,
        PowerOfTwoFragment,
    )

    if isinstance(frag, ListOf):
        if not isinstance(value, list):  # one value for every item (the schema allowed it)
            return _fragment_problem(where, value, frag.inner, device_choices)
        if value and len(value) != frag.length:  # [] means the default for every item
            return f"{where}: must be a list of {frag.length} values for this kernel, got {len(value)}"
        for i, x in enumerate(value):
            if (bad := _fragment_problem(f"{where}[{i}]", x, frag.inner, device_choices)) is not None:
                return bad
        return None
    if device_choices:
        return None
    if isinstance(frag, PowerOfTwoFragment):
        ok, allowed = _pow2(frag.low, frag.high)(value), f"a power of two from {frag.low} to {frag.high}"
    elif isinstance(frag, BaseIntegerFragment):
        ok, allowed = _between(frag.low, frag.high)(value), f"an integer from {frag.low} to {frag.high}"
    elif isinstance(frag, EnumFragment):
        ok, allowed = _one_of(*frag.choices)(value), "one of " + ", ".join(map(repr, frag.choices))
    elif isinstance(frag, BooleanFragment):
        ok, allowed = type(value) is bool, "true or false"
    else:
        return None  # a kind of field the Triton backend's keys do not have
    return None if ok else f"{where}: must be {allowed} for this kernel, got {_show.repr(value)}"


def checked_config(config: Mapping[str, Any], spec: Any) -> Any:
    """`config` as a helion.Config that `spec` (the kernel's ConfigSpec at a shape) allows and
    has normalized; ConfigError (one line), or Helion's InvalidConfig, where it does not. The one door a config from a
    bundle takes to Helion: the runtime before it compiles, `validate` and `check`."""
    import helion

    if (bad := spec_problem(config, spec)) is not None:
        raise ConfigError(bad)
    cfg = helion.Config.from_dict(copy.deepcopy(dict(config)))  # normalize edits in place
    spec.normalize(cfg)  # Helion's own check (InvalidConfig): known keys, lengths, block-size items
    return cfg
