"""The live per-shape code-path choices of the runtime, in one registry.

Where the runtime can run a step in more than one way, a rule picks one per shape, and an
environment variable may force one, for measuring. Each `PathChoice` names the choice, its
choices, the kernels each runs, the rule (where it lives; its docstring keeps the numbers that
chose it) and the variable that overrides it; `choose` is the one
place a call site asks, and `mamba_tune.env` the one parser of the variable. docs/paths.md's
table is `markdown()` (tests/runtime/test_env.py checks they agree).

No choice here changes a kernel's program at a given key: each selects other kernels, which have
keys of their own; a kernel whose program depends on the shape (the dB/dC kernel's head runs) takes
it from its key dims. Torch-free: `import mamba_tune` checks the variables (mamba_tune.env) without
loading the kernels.
"""

from __future__ import annotations

import dataclasses

from mamba_tune import env


@dataclasses.dataclass(frozen=True)
class PathChoice:
    name: str
    # The environment variable that forces one choice (parsed by mamba_tune.env).
    var: str
    # Choice -> the kernels (bundle names) it runs.
    choices: dict[str, tuple[str, ...]]
    # Where the per-shape rule lives ("module.function"). There is no fixed default form: a form
    # that loses everywhere is deleted, not kept behind a variable.
    rule: str
    # One line: what is chosen and by what rule.
    doc: str

    def choose(self, ruled: str) -> str:
        """The forced choice (the variable), else `ruled` (the rule's answer at this shape)."""
        if ruled not in self.choices:
            raise ValueError(f"{self.name}: the rule chose {ruled!r}, not one of {', '.join(self.choices)}")
        forced = env.read(self.var)
        return ruled if forced is None else forced


PATHS: dict[str, PathChoice] = {p.name: p for p in (
    PathChoice(
        name="ssd_state_passing_bwd",
        var="MAMBA_TUNE_SSD_SP_BWD",
        choices={"fused": ("ssd_chunk_state_passing_bwd",), "split": ("ssd_chunk_state", "ssd_state_passing_bwd")},
        rule="mamba_tune.keys.split_state_passing_bwd",
        doc="the SSD backward's state gradients (B2 + B3): one walk over the chunks with a dot per step, or F2's "
            "kernel then an elementwise walk; split where batch x nheads < 64 or chunk_size >= 256",
    ),
    PathChoice(
        name="ssd_dbdc",
        var="MAMBA_TUNE_SSD_DBDC",
        choices={"one": ("ssd_chunk_state_scan_bwd_dbdc",), "two": ("ssd_chunk_state_scan_bwd_dcb",
                                                                    "ssd_bmm_bwd_dbdc")},
        rule="mamba_tune.keys.two_pass_dbdc",
        doc="the SSD backward's dB and dC (B5-B8): one kernel, or two passes through a head-summed dCB buffer; "
            "two at dstate >= 256",
    ),
)}


for _p in PATHS.values():
    env.register_choice(_p.var, tuple(_p.choices), f"force `{_p.name}` (mamba_tune.paths): {_p.doc}")


def choose(name: str, rule: str) -> str:
    """Which form of `name` runs: its variable's choice when set, else `rule` (the rule's answer at this shape)."""
    return PATHS[name].choose(rule)


def markdown() -> str:
    """docs/paths.md's table of the choices."""
    rows = ["| choice | variable | forms (kernels) | rule | what |", "|---|---|---|---|---|"]
    for p in PATHS.values():
        forms = "; ".join(f"`{c}`: {', '.join(f'`{k}`' for k in ks) or 'torch'}" for c, ks in p.choices.items())
        rows.append(f"| `{p.name}` | `{p.var}` | {forms} | `{p.rule}` | {p.doc} |")
    return "\n".join(rows) + "\n"
