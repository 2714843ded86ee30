"""Two searches of the same combos, side by side: how soon each came within 1% of the better end.

    python scripts/compare_searches.py A.json B.json [--pct 1]

For each entry key in both bundles (say, `mamba-tune tune ... --name cold` and the same with
`--warm-start generated_configs/h200/nemotron-nano.json --name warm`), from the entries' search
traces (`search.trace`, Helion's autotune log): each search's final best, and the seconds each
took to come within PCT percent of the better of the two finals ("never" if it did not), with
the ratio A / B. No GPU needed.
"""

from __future__ import annotations

import argparse
import sys


def within(trace: list[tuple[float, float]] | None, target_ms: float) -> float | None:
    """Seconds into the search when its best first reached target_ms (None: never, or no trace)."""
    return next((float(t) for t, ms in trace or [] if ms <= target_ms), None)


def compare(a, b, pct: float) -> list[str]:  # noqa: ANN001 - two Bundles
    """One line per key the two bundles share, in key order."""
    lines = []
    for key in sorted(set(a.entries) & set(b.entries)):
        ta, tb = a.entries[key].search.trace, b.entries[key].search.trace
        if not ta or not tb:
            lines.append(f"{key}: no trace in {'A' if not ta else 'B'}")
            continue
        best = min(ta[-1][1], tb[-1][1])
        sa, sb = within(ta, best * (1 + pct / 100)), within(tb, best * (1 + pct / 100))
        ratio = f"{sa / sb:.2f}x" if sa is not None and sb and sb > 0 else "-"

        def fmt(s: float | None) -> str:
            return "never" if s is None else f"{s:.1f} s"

        lines.append(f"{key}: final best A {ta[-1][1]:.4f} ms, B {tb[-1][1]:.4f} ms; within {pct:g}% of "
                     f"{best:.4f} ms: A {fmt(sa)}, B {fmt(sb)} (A / B {ratio})")
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", help="bundle A (JSON)")
    p.add_argument("b", help="bundle B (JSON)")
    p.add_argument("--pct", type=float, default=1.0, help="how close to the better final best counts (percent)")
    args = p.parse_args(argv)
    if not args.pct >= 0:
        p.error(f"--pct {args.pct}: must be 0 or more")
    from mamba_tune.bundle import BundleError, load_bundle

    try:
        a, b = load_bundle(args.a), load_bundle(args.b)
    except (BundleError, OSError) as e:
        print(f"compare_searches: {e}", file=sys.stderr)
        return 2
    lines = compare(a, b, args.pct)
    if not lines:
        print(f"compare_searches: {args.a} and {args.b} share no entry", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
