"""Every key of the generation and evaluation trees, described once with `rljax.config.keys.Key` records.

`GENERATE_KEYS` holds one record per key of `config.get_generate_config()`
(verl's `generation.yaml`) and `EVAL_KEYS` one per key of
`config.get_eval_config()` (verl's `evaluation.yaml`): its meaning, from
verl's documents, and where rljax does not honour it as verl does, how not
(`ignored`, `added`, as in the RL tree's `rljax.config.keys`).
`GENERATE_IGNORED_SECTIONS` and `EVAL_IGNORED_SECTIONS` ignore every key
below a prefix. `rljax.docs_reference` renders the records in
docs/configuration_sft_eval.md, and `tests/test_docs.py` fails when a key
of either tree has no record here.
"""

from __future__ import annotations

from rljax.config.keys import KEYS as RL_KEYS
from rljax.config.keys import Key, ignored_table

_VLLM_OPTION = "vLLM option"
_NO_LOG_PROBS = "generation computes no log-probs"

# Generation keys that mean what an RL-tree key means: key -> that key.
_GENERATE_AS_IN_RL = {
    "data.prompt_key": "data.prompt_key",
    "model.external_lib": "actor_rollout_ref.model.external_lib",
    "ray_init.num_cpus": "ray_init.num_cpus",
    "ray_init.timeline_json_file": "ray_init.timeline_json_file",
    "rollout.cpu_dot_library": "actor_rollout_ref.rollout.cpu_dot_library",
    "rollout.disable_log_stats": "actor_rollout_ref.rollout.disable_log_stats",
    "rollout.enable_chunked_prefill": "actor_rollout_ref.rollout.enable_chunked_prefill",
    "rollout.enforce_eager": "actor_rollout_ref.rollout.enforce_eager",
    "rollout.gpu_memory_utilization": "actor_rollout_ref.rollout.gpu_memory_utilization",
    "rollout.ignore_eos": "actor_rollout_ref.rollout.ignore_eos",
    "rollout.kv_cache_dtype": "actor_rollout_ref.rollout.kv_cache_dtype",
    "rollout.quantization": "actor_rollout_ref.rollout.quantization",
    "rollout.mode": "actor_rollout_ref.rollout.mode",
    "rollout.prefill_length_buckets": "actor_rollout_ref.rollout.prefill_length_buckets",
    "rollout.top_k": "actor_rollout_ref.rollout.top_k",
    "rollout.top_p": "actor_rollout_ref.rollout.top_p",
}

GENERATE_KEYS = {
    **{key: RL_KEYS[rl] for key, rl in _GENERATE_AS_IN_RL.items()},
    # actor
    "actor.fsdp_config.fsdp_size": Key("FSDP: devices that shard the rollout worker's parameters; -1 uses all."),
    "actor.strategy": Key("Backend of verl's rollout worker (fsdp)."),
    "actor.ulysses_sequence_parallel_size": Key("Ulysses sequence-parallel size of verl's rollout worker."),
    # data
    "data.batch_size": Key("Prompts generated for at once."),
    "data.n_samples": Key("Responses generated per prompt."),
    "data.output_path": Key("Parquet file the prompts and their responses are written to; null writes NAME-responses.parquet beside data.path."),
    "data.path": Key("Parquet file of prompts (verl's format: a chat-message prompt column)."),
    "data.image_key": Key(
        "Column holding each prompt's images (a list of {'bytes': ...}, {'path': ...} or paths; each <image> in the "
        "prompt's text is where one goes), as the RL data's data.image_key.",
        added="read when the model is a vision-language model (Qwen2.5-VL, Qwen3-VL)"),
    "data.image_patch_size": Key(
        "Patch size of the images' first resize (multiples of twice it), as the RL data's data.image_patch_size.",
        added="read with data.image_key"),
    "data.tokenizer": Key(
        "Tokenizer to use; null takes the model's own.",
        added="tokenizer path or alias (default: the model's)"),
    "data.truncation": Key(
        "What to do with a prompt longer than rollout.prompt_length: error, or cut it at the left, right or middle.",
        added="error (default), left, right or middle: what a prompt longer than rollout.prompt_length gets"),
    # model
    "model.checkpoint": Key(
        "An rljax run to generate with: its latest complete checkpoint, or the global_step_N directory named.",
        added=("an rljax run directory (trainer.default_local_dir) or one of its global_step_N directories: generate "
               "with that actor instead of model.path")),
    "model.path": Key("The model to generate with: a Hugging Face directory, a GGUF file or a known alias."),
    # ray_init
    # rollout
    "rollout.attention_kernel": RL_KEYS["actor_rollout_ref.model.attention_kernel"],
    "rollout.do_sample": Key("Sample (true) or decode greedily (false)."),
    "rollout.dtype": Key("Dtype of the weights and activations during generation."),
    "rollout.free_cache_engine": Key("Release the engine's KV cache when generation ends."),
    "rollout.load_format": Key("How vLLM receives the model's weights.", ignored="the engine reads the loaded arrays in place"),
    "rollout.log_prob_micro_batch_size": Key("Old global micro-batch of log-prob passes.", ignored=_NO_LOG_PROBS),
    "rollout.log_prob_micro_batch_size_per_gpu": Key("Responses per log-prob forward pass on each device.", ignored=_NO_LOG_PROBS),
    "rollout.max_model_len": Key(
        "Longest prompt plus response the engine holds; null = prompt_length + response_length.",
        ignored="the KV cache holds prompt_length + response_length"),
    "rollout.max_num_batched_tokens": Key("vLLM: tokens processed per scheduler step.", ignored="vLLM scheduler budget"),
    "rollout.max_num_seqs": Key("Sequences the engine decodes at once."),
    "rollout.n": Key("Responses per prompt of one engine call (data.n_samples sets how many are generated)."),
    "rollout.name": Key("Inference engine (vllm, sglang, trtllm or hf in verl).", ignored="any value selects rljax's JetStream engine"),
    "rollout.prompt_length": Key("Longest prompt in tokens."),
    "rollout.response_length": Key("Tokens generated per response at most."),
    "rollout.temperature": Key("Sampling temperature; 0 decodes greedily."),
    "rollout.tensor_model_parallel_size": Key("Devices that split each weight matrix."),
    "rollout.use_fire_sampling": Key(
        "FIRE sampling (a higher temperature for the first token).",
        ignored="not implemented by the JetStream engine"),
    # trainer
    "trainer.n_gpus_per_node": Key("Accelerators per host.", type_note="int or 'auto'"),
    "trainer.nnodes": Key("Number of hosts (processes); each generates its share of every batch.",
                          type_note="int or 'auto'"),
    "trainer.seed": Key("Seed of the sampling.", added="seed of the sampling PRNG key"),
}
GENERATE_IGNORED_SECTIONS = {
    "actor": "FSDP options of verl's rollout worker",
    "ray_init": "no Ray: one JAX process",
}

EVAL_KEYS = {
    "custom_reward_function.path": RL_KEYS["custom_reward_function.path"],
    "ray_init.num_cpus": RL_KEYS["ray_init.num_cpus"],
    "custom_reward_function.name": Key("Name of the scoring function in that file."),
    "custom_reward_function.reward_kwargs": Key(
        "Extra keyword arguments passed to that function.",
        added="keyword arguments added to each call of the custom function"),
    "data.data_source_key": Key("Column naming each row's data source: it picks the scorer, and metrics are reported per source."),
    "data.output_path": Key(
        "JSON file the metrics are written to.",
        added="the JSON report (default: beside data.path, NAME-eval.json)"),
    "data.path": Key("Parquet file of prompts and generated responses (what rljax.generate writes)."),
    "data.prompt_key": Key(
        "Column holding the prompt.",
        ignored="scores do not depend on the prompt; read by nothing"),
    "data.response_key": Key("Column holding each prompt's generated responses (a list of strings)."),
    "data.reward_model_key": Key("Column holding the reference answer (reward_model['ground_truth'])."),
    "eval.pass_threshold": Key(
        "Score at which a response counts as passing (pass@k).",
        added="a response passes when its score is >= this (pass@k)"),
}
EVAL_IGNORED_SECTIONS = {
    "ray_init": "no Ray: responses are scored in this process",
}

GENERATE_IGNORED_KEYS = ignored_table(GENERATE_KEYS, GENERATE_IGNORED_SECTIONS)
EVAL_IGNORED_KEYS = ignored_table(EVAL_KEYS, EVAL_IGNORED_SECTIONS)
