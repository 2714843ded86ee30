"""The bench tests' shared check: `mamba-tune bench` refusing a call is one line, exit 2, no result file."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from autotune_cli.app import app


def assert_bench_refuses(tmp_path: Path, args: list[str], message: str) -> None:
    """`mamba-tune bench ARGS --json-out FILE` exits 2 with one line that says `message`, and writes no FILE."""
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["bench", *args, "--json-out", str(out)])
    assert r.exit_code == 2, r.output
    assert message in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not out.exists()
