"""Benchmarks of a real Conduit stack on this machine; see bench/README.md."""
