"""Pallas TPU kernels: flash (splash) attention for the training passes, ragged decode attention.

Each runs compiled on TPU and in Pallas' interpreter elsewhere (tests);
`rljax.models.attention` picks them by `ModelConfig.attention_kernel`.
"""
