"""Tests of rljax.trainer."""
