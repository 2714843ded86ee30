"""The package layout: `kernels/` is the training-time library only, and no import circles.

`import mamba_tune` (what a training process does) must not load the tuner (`autotune_cli`),
an fp32 reference or a tuning record. And the project's modules must form no import
circle; every import statement counts, function-level (lazy) ones too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Folder -> package name (kernels/ installs as mamba_tune: pyproject's package-dir).
PACKAGES = {"kernels": "mamba_tune", "autotune_cli": "autotune_cli"}
PROJECT = (*PACKAGES.values(), "generated_configs")


def test_import_kernels_loads_no_tuning_or_reference_module(clean_env: dict[str, str]) -> None:
    # Every public name too: they load on first use.
    code = "import mamba_tune, sys; [getattr(mamba_tune, n) for n in mamba_tune.__all__]; print('\\n'.join(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=clean_env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    loaded = [m for m in r.stdout.split() if m.split(".")[0] in PROJECT]
    assert "mamba_tune.runtime" in loaded  # the probe saw the project's modules at all
    bad = [m for m in loaded if m.split(".")[0] == "autotune_cli" or "reference" in m or "tuning" in m]
    assert not bad, f"`import mamba_tune` loads {', '.join(bad)}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    parts[0] = PACKAGES[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The project modules one import statement loads (not counting parent packages)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if is_package else module.split(".")[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            yield name


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    known = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        imports = (n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))
        graph[module] = {t for node in imports
                         for t in _targets(node, module, path.name == "__init__.py", known) if t != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_import_graph_reads_the_project() -> None:
    graph = import_graph()
    assert "mamba_tune.runtime" in graph["mamba_tune.norm.gated"]
    assert "mamba_tune.ssd.common" in graph["mamba_tune.ssd.chunk_scan"]
    assert "autotune_cli.tuning" in graph["autotune_cli.sweep_job"]


def test_kernels_import_nothing_of_autotune_cli() -> None:
    graph = import_graph()
    bad = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.split(".")[0] == "mamba_tune"
                 for t in targets if t.split(".")[0] != "mamba_tune")
    assert not bad, "kernels/ imports outside itself: " + "; ".join(bad)


def test_the_key_schema_imports_only_the_standard_library() -> None:
    # mamba_tune.keys is what the torch-free commands read: not even the package's other modules.
    path = ROOT / "kernels" / "keys.py"
    tree = ast.parse(path.read_text(), filename=str(path))
    names = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    names |= {n.module or "." for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module != "__future__"}
    bad = sorted(m for m in names if m.split(".")[0] not in sys.stdlib_module_names)
    assert not bad, f"kernels/keys.py imports {', '.join(bad)}"


def test_no_import_circle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])
