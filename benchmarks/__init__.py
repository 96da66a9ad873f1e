"""Benchmarks of variance_lab against the limits of the machine: ``python -m benchmarks``."""
