"""The example CI workflow parses and calls mamba-tune commands and options that exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import typer.main
import yaml

from autotune_cli.app import app

WORKFLOW = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "tune-gpu-sku.yml"


def load() -> dict[Any, Any]:
    data = yaml.safe_load(WORKFLOW.read_text())
    assert isinstance(data, dict)
    return data


def run_scripts(data: dict[Any, Any]) -> list[str]:
    return [step["run"] for job in data["jobs"].values() for step in job["steps"] if "run" in step]


def invocations(script: str) -> list[list[str]]:
    """Each `mamba-tune ...` command in a shell script, as tokens (continuations joined)."""
    text = re.sub(r"\$\{\{[^}]*\}\}", "X", script.replace("\\\n", " "))
    found = []
    for line in text.splitlines():
        if "mamba-tune " not in line:
            continue
        cmd = line[line.index("mamba-tune "):]
        cmd = re.split(r"\s(?:\|\||>>|>|2>&1|;|&&)\s?", cmd)[0]
        found.append(shlex.split(cmd))
    return found


def test_parses_with_both_jobs() -> None:
    data = load()
    triggers = data.get("on", data.get(True))  # YAML 1.1 reads a bare `on` as true
    assert {"pull_request", "workflow_dispatch"} <= set(triggers)
    assert set(data["jobs"]) == {"coverage", "tune", "comment"}
    tune = data["jobs"]["tune"]
    include = tune["strategy"]["matrix"]["include"]
    assert {m["sku"] for m in include} >= {"h200"}
    for m in include:
        assert m["runner"][0] == "self-hosted" and m["sku"] in m["runner"]
    assert tune["runs-on"] == "${{ matrix.runner }}"
    assert data["jobs"]["coverage"]["runs-on"] == "ubuntu-latest"
    uses = {step.get("uses", "").split("@")[0] for job in data["jobs"].values() for step in job["steps"]}
    assert "actions/upload-artifact" in uses
    assert any("gh pr comment" in s for s in run_scripts(data))


def test_pr_code_gets_no_credentials_and_new_commits_need_a_new_approval() -> None:
    data = load()
    jobs = data["jobs"]
    # The workflow's token only reads; only the job that posts comments may write to PRs.
    assert data["permissions"] == {"contents": "read"}
    for name, job in jobs.items():
        writes = {k for k, v in job.get("permissions", {}).items() if v == "write"}
        assert writes <= ({"pull-requests"} if name == "comment" else set()), name
    # No checkout leaves the token in .git/config for the PR's code.
    checkouts = [s for job in jobs.values() for s in job["steps"] if s.get("uses", "").startswith("actions/checkout")]
    assert checkouts and all(s.get("with", {}).get("persist-credentials") is False for s in checkouts)
    # Self-hosted runs of PR code wait for an environment's required reviewers on every run.
    assert jobs["tune"]["environment"] == "gpu-tuning"
    assert "synchronize" in data.get("on", data.get(True))["pull_request"]["types"]
    # gh runs only where no PR code was checked out or installed, by absolute path.
    for name, job in jobs.items():
        gh = [s for s in job["steps"] if "gh " in s.get("run", "")]
        if not gh:
            continue
        assert name == "comment" and not any("checkout" in s.get("uses", "") for s in job["steps"])
        assert not any("pip" in s.get("run", "") or "GITHUB_PATH" in s.get("run", "") for s in job["steps"])
        assert all(re.search(r"(^|\s)/usr/bin/gh ", s["run"], re.M) for s in gh)
        assert all("GH_TOKEN" in s.get("env", {}) for s in gh)
    assert not any("GH_TOKEN" in s.get("env", {}) for name, j in jobs.items() if name != "comment" for s in j["steps"])


def test_every_mamba_tune_call_exists() -> None:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    calls = [c for s in run_scripts(load()) for c in invocations(s)]
    used = {c[1] for c in calls}
    assert {"sweep", "verify", "diff", "check", "validate", "report"} <= used
    for call in calls:
        assert call[1] in commands, f"unknown command: {' '.join(call)}"
        opts = {o for p in commands[call[1]].params for o in (*p.opts, *getattr(p, "secondary_opts", []))}
        for token in call[2:]:
            if token.startswith("-"):
                assert token.split("=")[0] in opts, f"mamba-tune {call[1]} has no option {token}"
    diff = next(c for c in calls if c[1] == "diff")
    assert diff[diff.index("--format") + 1] == "markdown"


def test_invocations_parser() -> None:
    got = invocations('x=1\nmamba-tune diff "$A:b" c --missing-ok \\\n  --format markdown > d.md || rc=$?\n')
    assert got == [["mamba-tune", "diff", "$A:b", "c", "--missing-ok", "--format", "markdown"]]


def test_third_party_actions_are_pinned_by_commit():
    """A tag can be moved to other code; a commit cannot. Each `uses:` names a full commit
    SHA, with the release it was tagged with in a comment."""
    uses = re.findall(r"^\s*-?\s*uses:\s*(\S+)(.*)$", WORKFLOW.read_text(), flags=re.M)
    assert uses
    for ref, comment in uses:
        if ref.startswith("./"):  # an action of this repository
            continue
        action, _, pin = ref.partition("@")
        assert re.fullmatch(r"[0-9a-f]{40}", pin), f"{ref}: pin {action} by its commit SHA"
        assert re.fullmatch(r"\s*# v\d+(\.\d+)*", comment), f"{ref}: name the release in a comment ({comment!r})"
