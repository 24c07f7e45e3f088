"""NUTS/HMC baseline over the same log joint (Pyro's kernels inside)."""

from .hmc import HMC, NUTS, ChainState, MCMCState

__all__ = ["HMC", "NUTS", "ChainState", "MCMCState"]
