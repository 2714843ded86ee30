"""Tuned config bundles (data): generated_configs/<gpu sku>/<spec name>.json."""
