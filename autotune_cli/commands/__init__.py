"""One module per command group, joined in autotune_cli.app."""
