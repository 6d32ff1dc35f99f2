"""Benchmarks and the attention variant catalog they share with the tests (:mod:`bench.variants`)."""
