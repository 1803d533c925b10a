"""Tests of dil_jax.reading."""
