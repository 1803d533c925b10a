"""Tests of tools/'s scripts."""
