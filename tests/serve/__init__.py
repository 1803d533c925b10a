"""Tests of dil_jax.serve."""
