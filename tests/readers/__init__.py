"""Tests of dil_jax.readers."""
