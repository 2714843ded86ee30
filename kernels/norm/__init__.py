"""Gated RMSNorm / LayerNorm family."""

from mamba_tune.norm.gated import LayerNormGated, RMSNormGated, layernorm_fn, rmsnorm_fn

__all__ = ["LayerNormGated", "RMSNormGated", "layernorm_fn", "rmsnorm_fn"]
