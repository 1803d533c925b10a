"""Tests of dil_jax.bench."""
