"""Tests of rljax.rl."""
