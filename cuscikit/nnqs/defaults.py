"""Default NNQS-SCI settings, in one place (the Runner, the CLI and the benchmarks read them)."""

DEFAULT_TOPK = 1024
"""Configurations added to S per iteration."""

DEFAULT_REFERENCE_BIAS = 2.0
"""Extra logit for the Hartree-Fock token at each position of a fresh ansatz."""
