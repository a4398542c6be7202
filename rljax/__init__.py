"""rljax: JAX-native RL post-training of language models, in verl's configuration language."""

__version__ = "0.1.0"
