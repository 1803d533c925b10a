"""Tests of dil_jax.model."""
