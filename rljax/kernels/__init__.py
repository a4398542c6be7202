"""Pallas TPU kernels: flash (splash) attention for the training passes, ragged decode attention, and a grouped
matmul over 8-bit expert kernels.

Each runs compiled on TPU and in Pallas' interpreter elsewhere (tests);
`rljax.models.attention` picks the attention kernels by
`ModelConfig.attention_kernel`, and `rljax.models.moe` takes the grouped
matmul for float8 rollout experts on the TPUs whose own would convert them.
"""
