"""Tests of dil_jax.train."""
