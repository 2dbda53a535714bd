"""Benchmarks of xla_pcache against its peers: ``python bench/run.py [--quick]``."""
