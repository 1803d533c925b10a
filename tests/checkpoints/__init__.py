"""Tests of dil_jax.checkpoints."""
