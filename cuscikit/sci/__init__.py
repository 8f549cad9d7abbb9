"""Configurations, the Hamiltonian, coupled sets, de-duplication and SCI spaces."""
