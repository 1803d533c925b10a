"""Tests of dil_jax.prescreening."""
