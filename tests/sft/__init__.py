"""Tests of rljax.sft."""
