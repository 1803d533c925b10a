"""Tests of dil_jax.data."""
