"""Ahead-of-time compilation of rljax's steps for TPU topologies, and what the compiler says of them."""
