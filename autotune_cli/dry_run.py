"""`sweep --cpu-dry-run` at dims a CPU holds: the spec's models shrunk, its kernels, options
and dtypes kept.

Helion's ref mode runs the kernels as eager PyTorch; at a real model's shapes (Nemotron-H 8B,
seqlen 8192) one worker grew past 21 GB. The dry run checks the spec end to end, not its
timings, so each model whose SSD intermediates (batch x seqlen x nheads x the widest of
headdim, dstate and chunk_size elements) exceed `CPU_ELEMENTS` is shrunk before it is planned:

- seqlen: two chunks plus the real seqlen's remainder (so a last partial chunk stays one);
- batch: at most 2;
- ngroups: the fewest groups (each with the real model's heads per group, which the group
  rules read) at which the plan keeps every (kernel, dtype, option) the real shapes have:
  the dispatch rules that read absolute sizes (`split_state_passing_bwd`'s batch * nheads)
  are checked by planning both, not mirrored here;
- headdim, dstate and chunk_size: kept (tile shapes and the rules that read them).

Kernels the shrunk shapes run and the real ones do not (a dispatch rule that reads absolute
sizes, taking another path at small shapes) are named in the notes.
"""

from __future__ import annotations

from autotune_cli.limits import dims_problem
from autotune_cli.plan import Combo, plan
from autotune_cli.spec import ResolvedModel, Spec

MAX_BATCH = 2
# Above this many elements in a model's largest SSD intermediate, its dims are shrunk (at
# 2**22, 16 MB in fp32, a ref-mode worker stays within a few GB).
CPU_ELEMENTS = 2**22


def cpu_elements(m: ResolvedModel) -> int:
    """A model's largest SSD intermediate in elements, roughly (what ref mode holds per tensor)."""
    return max(m.batch) * max(m.seqlen) * m.nheads * max(m.headdim, m.dstate, m.chunk_size)


def _option(name: str, value: int) -> bool:
    """A key dim that is an option (a flag) rather than a size."""
    return value in (0, 1) and not name.endswith(("_partials", "runs")) and name not in (
        "batch", "seqlen", "nheads", "headdim", "ngroups", "dstate", "chunk_size", "rows", "d", "group_size", "dim")


def signature(combos: list[Combo]) -> set[tuple[str, str, tuple[tuple[str, int], ...]]]:
    """What a plan runs, sizes aside: (kernel, dtype, its option dims)."""
    return {(c.kernel, c.dtype, tuple(sorted((k, v) for k, v in c.dims.items() if _option(k, v)))) for c in combos}


def _shrunk(m: ResolvedModel, ngroups: int) -> ResolvedModel:
    per_group = m.nheads // m.ngroups
    q = m.chunk_size
    seqlen = sorted({s if s <= 2 * q + s % q else 2 * q + s % q for s in m.seqlen})
    return m.model_copy(update={"ngroups": ngroups, "nheads": ngroups * per_group, "seqlen": seqlen,
                                "batch": sorted({min(b, MAX_BATCH) for b in m.batch})})


def shrink_for_cpu(spec: Spec) -> tuple[Spec, list[str]]:
    """The spec with each model over `CPU_ELEMENTS` shrunk (see the module's docstring), and one
    note per shrunk model."""
    models: list[ResolvedModel] = []
    notes: list[str] = []
    for m in spec.models:
        if cpu_elements(m) <= CPU_ELEMENTS:
            models.append(m)
            continue
        want = signature(plan(spec.model_copy(update={"models": [m]})))
        for g in [g for g in range(1, m.ngroups + 1) if m.ngroups % g == 0]:
            small = _shrunk(m, g)
            if any(dims_problem({"batch": b, "seqlen": s, "nheads": small.nheads, "headdim": small.headdim,
                                 "ngroups": small.ngroups, "dstate": small.dstate, "chunk_size": small.chunk_size})
                   for b in small.batch for s in small.seqlen):
                continue
            got = signature(plan(spec.model_copy(update={"models": [small]})))
            if want <= got:
                break
        else:
            small, got = m, want  # no smaller shape runs the same kernels: the real one
        models.append(small)
        extra = sorted({k for k, _d, _o in got - want} - {k for k, _d, _o in want})

        def arrow(name: str, before: object, after: object) -> str:
            return f"{name} {before}" + ("" if before == after else f" -> {after}")

        def listed(values: list[int]) -> str:
            return ",".join(map(str, values))

        notes.append(
            f"{m.name} tp={m.tp}: " + ", ".join([
                arrow("seqlen", listed(m.seqlen), listed(small.seqlen)),
                arrow("batch", listed(m.batch), listed(small.batch)),
                arrow("nheads", m.nheads, small.nheads), arrow("ngroups", m.ngroups, small.ngroups)])
            + f" ({m.nheads // m.ngroups} heads per group kept)"
            + (f"; also runs {', '.join(extra)}, which the real shapes do not" if extra else ""))
    return spec.model_copy(update={"models": models}), notes
