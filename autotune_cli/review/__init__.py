"""Reviewing bundles: `diff` (what a PR changes), `check` (coverage gate for CI),
`verify` (re-run every entry on the GPU) and `report` (plots and a markdown summary).

The logic lives here, free of Typer; `autotune_cli.commands.review` is the CLI on top.
"""
