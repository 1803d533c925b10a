"""Tests of dil_jax.commands."""
