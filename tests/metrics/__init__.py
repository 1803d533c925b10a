"""Tests of dil_jax.metrics."""
