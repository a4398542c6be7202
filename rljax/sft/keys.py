"""Every key of the SFT tree (verl's `sft_trainer.yaml`), described once with `rljax.config.keys.Key` records.

`KEYS` holds one record per key of `config.get_sft_config()`: its meaning,
from verl's SFT documents, and where rljax does not honour it as verl does,
how not (`ignored`, `mapped`, `added`, `deprecated`, `alias_of`, as in the
RL tree's `rljax.config.keys`). `IGNORED_KEYS` and `ALIASES` are views of
it (`config.finalize` reads `ALIASES`); `rljax.docs_reference` renders the
records in
docs/configuration_sft_eval.md, and `tests/test_docs.py` fails when a key of
the tree has no record here.
"""

from __future__ import annotations

from rljax.config.keys import KEYS as RL_KEYS, LORA_MEANINGS, Key, described, ignored_table, view

# Keys that mean in the SFT tree what they mean in the RL tree.
_AS_IN_RL = (
    "data.train_files",
    "data.use_shm",
    "data.val_files",
    "trainer.default_hdfs_dir",
    "trainer.default_local_dir",
    "trainer.experiment_name",
    "trainer.logger",
    "trainer.logical_axis_rules",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "trainer.project_name",
    "trainer.resume_from_path",
    "trainer.resume_mode",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.total_epochs",
    "trainer.total_training_steps",
)

KEYS = {
    **{path: RL_KEYS[path] for path in _AS_IN_RL},
    # data
    "data.balance_dp_token": Key(
        "Divide the loss by the response tokens of the whole global batch rather than of each device's share.",
        mapped=("the loss is always divided by the response-token count of the whole global batch (verl's "
                "balance_dp_token=true), so true and false give the same numbers")),
    "data.chat_template": Key(
        "Chat template that renders each example instead of the tokenizer's; null uses the tokenizer's.",
        mapped="a jinja2 chat template (the text, or a path to a .jinja file) replacing the tokenizer's"),
    "data.max_length": Key("Longest example in tokens (prompt and response together)."),
    "data.micro_batch_size": Key(
        "Old global micro-batch size; replaced by micro_batch_size_per_gpu.",
        deprecated=("data.micro_batch_size_per_gpu", "global rows / data-parallel devices")),
    "data.micro_batch_size_per_gpu": Key(
        "Examples per forward/backward pass on each device; gradients accumulate over micro-batches.",
        mapped=("rows per data-parallel device in each gradient-accumulation step (packed rows with "
                "use_remove_padding); null (an error in verl): the device's whole share of data.train_batch_size "
                "in one step")),
    "data.multiturn.enable": Key("Read each row as a conversation (messages_key) instead of a prompt and a response."),
    "data.multiturn.messages_key": Key("Column holding each row's chat messages (multiturn.enable=true)."),
    "data.prompt_dict_keys": Key("Keys to look the prompt up through when prompt_key's column holds dictionaries."),
    "data.prompt_key": Key("Column holding the prompt (single-turn data)."),
    "data.image_key": Key(
        "Column holding each row's images (a vision-language model's: each <image> in the messages' text is where "
        "one goes), as the RL data's data.image_key.",
        added="read when model.partial_pretrain is a vision-language model (Qwen2.5-VL, Qwen3-VL); verl 0.9.1's SFT trainer "
              "takes images through its processor"),
    "data.image_patch_size": Key(
        "Patch size of the images' first resize (multiples of twice it), as the RL data's data.image_patch_size.",
        added="read with data.image_key"),
    "data.response_dict_keys": Key("Keys to look the response up through when response_key's column holds dictionaries."),
    "data.response_key": Key("Column holding the response the model learns to write (single-turn data)."),
    "data.train_batch_size": Key("Examples per optimizer step."),
    "data.train_max_samples": Key(
        "Use at most this many training rows; -1 uses them all.",
        added="rows kept from data.train_files (-1: all; verl reads it with .get)"),
    "data.truncation": Key("What to do with an example longer than max_length: error, or cut it at the left or right."),
    "data.val_max_samples": Key(
        "Use at most this many validation rows; -1 uses them all.",
        added="rows kept from data.val_files (-1: all)"),
    # model
    **described(("",), "model", LORA_MEANINGS, {
        "alpha_pattern": dict(added="cosmos-rl: {regex: alpha} per HF module name; first match wins",
                              type_note="mapping {regex: number}"),
        "init_lora_weights": dict(added="cosmos-rl: true (A uniform, B=0) or gaussian (A normal, B=0)",
                                  type_note="bool or 'gaussian'"),
        "lora_alpha": dict(mapped="LoRA scaling alpha / r; read only with model.lora_rank > 0"),
        "lora_dropout": dict(added="cosmos-rl: dropout on the adapter input during training steps"),
        "lora_rank": dict(mapped="0 = full fine-tuning; > 0 trains LoRA adapters of this rank (rljax.models.lora)"),
        "modules_to_save": dict(added="cosmos-rl: base modules trained in full beside the adapters (embed_tokens, "
                                      "lm_head, ...)"),
        "r_pattern": dict(added="cosmos-rl: {regex: r} per HF module name; first match wins",
                          type_note="mapping {regex: int}"),
        "target_modules": dict(mapped="LoRA target modules (all-linear or HF projection names); read only with "
                                      "model.lora_rank > 0", type_note="str or list"),
        "use_rslora": dict(added="cosmos-rl: scale alpha / sqrt(r) instead of alpha / r"),
    }),
    "model.exclude_modules": Key(
        "LoRA: modules left without adapters.",
        added="as actor_rollout_ref.model.exclude_modules (PEFT's rule: a regex matching the whole HF module "
              "name, or a list of names); a vision-language model needs its tower left out ('.*visual.*')",
        type_note="str, list or null"),
    "model.enable_gradient_checkpointing": Key(
        "Recompute activations in the backward pass instead of storing them.",
        mapped="jax.checkpoint (remat) per decoder layer"),
    "model.external_lib": Key(
        "Python package imported first to register extra model or tokenizer classes.",
        mapped="a module imported before the model loads, as verl does (rljax models themselves are chosen by config.json)"),
    "model.fsdp_config.cpu_offload": Key(
        "FSDP: offload to host memory (with offload_params).",
        ignored="PyTorch FSDP CPU offload"),
    "model.fsdp_config.model_dtype": Key(
        "Dtype of the trained parameters: fp32, bf16 or fp16.",
        mapped="dtype of the trained parameters and of the computation (fp32, bf16, fp16)"),
    "model.fsdp_config.offload_params": Key(
        "FSDP: keep parameters (and gradients) in host memory, so the optimizer step runs on the CPU.",
        ignored="PyTorch FSDP CPU offload"),
    "model.fsdp_config.wrap_policy.min_num_params": Key(
        "FSDP: wrap modules with at least this many parameters.",
        ignored="sharding follows logical-axis rules, not module wrapping"),
    "model.partial_pretrain": Key(
        "The model to fine-tune: a checkpoint path.",
        mapped="an HF directory, a .gguf file or an alias such as smollm2-135m-instruct"),
    "model.scan_layers": Key(
        "Run the decoder layers as one scanned layer.",
        added="scan over decoder layers: compile time flat in depth"),
    "model.strategy": Key(
        "verl's training backend: fsdp or fsdp2.",
        ignored="FSDP/FSDP2 choice; rljax shards with a device mesh"),
    "model.trust_remote_code": Key(
        "Allow checkpoints that ship their own model or tokenizer code.",
        ignored=("rljax runs no code from a checkpoint: the architecture is one of rljax's Flax families picked by "
                 "config.json's model_type, the tokenizer is tokenizer.json and the chat template renders in a jinja2 "
                 "sandbox, so true and false behave the same")),
    "model.use_liger": Key(
        "Use the Liger fused kernels.",
        ignored="Liger's Triton kernels patch PyTorch models; XLA fuses on its own"),
    "model.use_shm": Key(
        "Load the model through shared memory.",
        ignored="shared-memory model loading"),
    # optim
    "optim.betas": Key("Adam's (beta1, beta2)."),
    "optim.clip_grad": Key("Maximum global gradient norm."),
    "optim.lr": Key("Peak learning rate."),
    "optim.lr_scheduler": Key("Learning-rate schedule after warm-up: cosine, or wsd (warm-up, stable, decay)."),
    "optim.lr_warmup_steps_ratio": Key(
        "verl's newer name of warmup_steps_ratio; null leaves warmup_steps_ratio in charge.",
        alias_of="optim.warmup_steps_ratio"),
    "optim.warmup_steps_ratio": Key("Warm-up length as a fraction of all training steps."),
    "optim.weight_decay": Key("Decoupled (AdamW) weight decay."),
    # trainer
    "trainer.device": Key("Accelerator platform.", mapped="checked only; JAX picks its platform (JAX_PLATFORMS)"),
    "trainer.max_ckpt_to_keep": Key(
        "Checkpoints kept; null keeps all.",
        mapped="newest complete steps orbax keeps (null: all)"),
    "trainer.seed": Key(
        "Seed of the run's random numbers.",
        mapped="seed of the data order (a fresh shuffle every epoch, as verl's sampler)"),
    # top level
    "ulysses_sequence_parallel_size": Key(
        "Devices that split each sequence (Ulysses sequence parallelism).",
        mapped="size of the mesh's sequence axis; the fsdp axis takes the other devices"),
    "use_remove_padding": Key(
        "Train on examples with their padding removed (sequence packing).",
        mapped="sequence packing: several examples per data.max_length row, kept apart by segment_ids"),
}

IGNORED_KEYS = ignored_table(KEYS, {})
# alias -> key: when set, the alias's value replaces the key's (`config.finalize`).
ALIASES = view(KEYS, "alias_of")
