"""mamba-tune: plan, tune, write and review Helion config bundles for Mamba-2 kernels."""

__version__ = "0.1.0"
