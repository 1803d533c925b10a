"""Tests of dil_jax.open_domain."""
