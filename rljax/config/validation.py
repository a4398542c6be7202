"""`validate`: every cross-key rule of the RL tree, checked before any work starts."""

from __future__ import annotations

import os

import jinja2
from ml_collections import ConfigDict

from rljax.config import engines, kernel_names
from rljax.config.checks import (check_data_files, check_enum, check_model_path, check_positive, check_range,
                                 mtp_layers_of, vision_language_type)
from rljax.config.errors import ConfigError, check, is_int, is_number
from rljax.config.choices import (
    ADAM_NAMES, AGENT_LOOPS, CHECKPOINT_CONTENTS, CPU_DOT_LIBRARIES, DEVICES, DTYPES, KL_CONTROLLERS, LOGGERS,
    LR_SCHEDULERS, RESUME_MODES, REWARD_MANAGERS, ROLLOUT_IS_LEVELS, ROLLOUT_IS_MODES, ROLLOUT_NAMES,
    OFF_POLICY_STRATEGIES, SANITY_CHECK_MODES, TOOL_CALL_FORMATS, TRAINER_MODES, TRUNCATE_SIDES, TRUNCATIONS,
)
from rljax.config.fields import get_node, routers_frozen
from rljax.config.keys import UNIMPLEMENTED_VALUES
from rljax.config.mapping import warn_once
from rljax.config.tree import get_base_config


def _check_batches(config: ConfigDict) -> None:
  data, actor = config.data, config.actor_rollout_ref.actor
  n = config.actor_rollout_ref.rollout.n
  mini_key = "actor_rollout_ref.actor.ppo_mini_batch_size"
  check_positive(config, "data.train_batch_size")
  check_positive(config, mini_key)
  check_positive(config, "actor_rollout_ref.rollout.n")
  check(actor.ppo_mini_batch_size <= data.train_batch_size, mini_key, actor.ppo_mini_batch_size,
        f"is larger than data.train_batch_size ({data.train_batch_size})", f"set {mini_key} <= {data.train_batch_size}")
  check((data.train_batch_size * n) % (actor.ppo_mini_batch_size * n) == 0, mini_key, actor.ppo_mini_batch_size,
        f"data.train_batch_size * rollout.n ({data.train_batch_size * n}) is not divisible by ppo_mini_batch_size * rollout.n ({actor.ppo_mini_batch_size * n})",
        f"set {mini_key} to a divisor of {data.train_batch_size}")
  _check_token_budgets(config)
  if actor.use_dynamic_bsz:
    return
  micro_key = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"
  micro = actor.ppo_micro_batch_size_per_gpu
  check(isinstance(micro, int) and not isinstance(micro, bool) and micro > 0, micro_key, micro,
        "must be a positive integer, or null for the whole per-device mini-batch (or set use_dynamic_bsz=true)",
        f"set {micro_key}=8")


def has_a_critic(config: ConfigDict) -> bool:
  """critic.enable, or by default (null) whether algorithm.adv_estimator reads a critic's values (GAE)."""
  enable = config.critic.enable
  return bool(enable) if enable is not None else kernel_names.needs_values(config.algorithm.adv_estimator)


def _token_budgets(config: ConfigDict) -> list[tuple[str, int, int]]:
  """(key, longest row in tokens, what sets it, sequence-parallel size) of every use_dynamic_bsz budget of a pass
  the run has."""
  data, arr, critic, rm = config.data, config.actor_rollout_ref, config.critic, config.reward_model
  row = (data.max_prompt_length + data.max_response_length, "max_prompt_length + max_response_length")
  actor_sp = arr.actor.ulysses_sequence_parallel_size
  critic_sp = critic.get("ulysses_sequence_parallel_size", 1) or 1
  reference = arr.actor.use_kl_loss or config.algorithm.use_kl_in_reward
  has_critic = has_a_critic(config)
  rm_row = row if rm.model.input_tokenizer in (None, arr.model.path) or not rm.max_length else (
      rm.max_length, "reward_model.max_length")
  budgets = [("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", arr.actor.use_dynamic_bsz, row, actor_sp),
             ("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", arr.rollout.log_prob_use_dynamic_bsz, row,
              actor_sp),
             ("actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", reference and arr.ref.log_prob_use_dynamic_bsz,
              row, actor_sp),
             ("critic.ppo_max_token_len_per_gpu", has_critic and critic.use_dynamic_bsz, row, critic_sp),
             ("critic.forward_max_token_len_per_gpu", has_critic and critic.use_dynamic_bsz, row, critic_sp),
             ("reward_model.forward_max_token_len_per_gpu", rm.enable and rm.use_dynamic_bsz,
              rm_row, 1)]
  return [(key, *longest, sp) for key, dynamic, longest, sp in budgets if dynamic and get_node(config, key) is not None]


def _check_token_budgets(config: ConfigDict) -> None:
  """A use_dynamic_bsz budget holds a device's share of the longest possible row (verl's rule: a row is never
  split across micro-batches)."""
  from rljax.sharding.mesh import device_tokens  # pylint: disable=import-outside-toplevel  (no jax at import)
  for key, longest, what, sequence in _token_budgets(config):
    need, value = device_tokens(longest, sequence), get_node(config, key)
    check(value >= need, key, value,
          f"must hold one whole sequence ({what} = {longest})" if sequence == 1 else
          f"must hold a device's share of one whole sequence ({what} = {longest} "
          f"over ulysses_sequence_parallel_size={sequence} devices: {need})", f"set {key} >= {need}")


def _check_lengths(config: ConfigDict) -> None:
  for key in ("data.max_prompt_length", "data.max_response_length",
              "actor_rollout_ref.rollout.prompt_length",
              "actor_rollout_ref.rollout.response_length",
              "actor_rollout_ref.rollout.max_num_seqs"):
    check_positive(config, key)
  buckets = config.actor_rollout_ref.rollout.prefill_length_buckets
  key = "actor_rollout_ref.rollout.prefill_length_buckets"
  check(bool(buckets) and all(isinstance(b, int) and b > 0 for b in buckets) and list(buckets) == sorted(set(buckets)),
        key, buckets, "must be a non-empty increasing list of positive lengths", f"e.g. {key}=[64,128,256,512]")


# transformers' own arguments of apply_chat_template, which a template never reads: rljax sets the rendering's
# (the messages, the generation prompt, the tools, text out) and implements none of the others
CHAT_TEMPLATE_CALL_ARGUMENTS = ("conversation", "messages", "add_generation_prompt", "tools", "tokenize",
                                "chat_template", "continue_final_message", "padding", "truncation", "max_length",
                                "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")


def _check_chat_template_kwargs(config: ConfigDict) -> None:
  """data.apply_chat_template_kwargs holds the template's own variables (enable_thinking, reasoning_effort)."""
  for name in config.data.apply_chat_template_kwargs:
    check(name not in CHAT_TEMPLATE_CALL_ARGUMENTS, f"data.apply_chat_template_kwargs.{name}",
          config.data.apply_chat_template_kwargs[name], "is an argument of transformers' apply_chat_template, "
          "not a variable of the chat template: rljax renders every prompt and turn itself",
          "drop it (the template's own variables, such as enable_thinking, are passed as given)")


def _check_custom_chat_template(config: ConfigDict) -> None:
  """actor_rollout_ref.model.custom_chat_template, where set, is Jinja source the tokenizer can compile."""
  key = "actor_rollout_ref.model.custom_chat_template"
  template = get_node(config, key)
  if template is None:
    return
  check(isinstance(template, str), key, template, "is not a Jinja template's text",
        "give the template's source as a string")
  try:
    jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
  except jinja2.TemplateSyntaxError as error:
    raise ConfigError(key, f"{template[:60]}..." if len(template) > 60 else template,
                      f"is not a valid Jinja template (line {error.lineno}: {error.message})",
                      "fix the template's syntax") from None


def _check_sampling(config: ConfigDict) -> None:
  for prefix in ("actor_rollout_ref.rollout", "actor_rollout_ref.rollout.val_kwargs"):
    check_range(config, f"{prefix}.top_p", 0.0, 1.0, lo_open=True)
    check_positive(config, f"{prefix}.temperature", allow_zero=True)
    check_positive(config, f"{prefix}.n")
    top_k = get_node(config, f"{prefix}.top_k")
    check(isinstance(top_k, int) and top_k >= -1, f"{prefix}.top_k", top_k, "must be -1 or 0 (off) or a positive integer", f"set {prefix}.top_k=-1 to disable")
  check_enum(config, "actor_rollout_ref.rollout.name", ROLLOUT_NAMES)
  check_enum(config, "actor_rollout_ref.rollout.cpu_dot_library", CPU_DOT_LIBRARIES)
  for key in ("actor_rollout_ref.rollout.dtype", "actor_rollout_ref.actor.fsdp_config.model_dtype",
              "actor_rollout_ref.actor.fsdp_config.dtype", "critic.model.fsdp_config.model_dtype",
              "critic.model.fsdp_config.dtype"):
    check_enum(config, key, DTYPES)
  from rljax.models import attention, kv_quant, remat  # pylint: disable=import-outside-toplevel
  from rljax.models.weight_quant import QUANTIZATIONS  # pylint: disable=import-outside-toplevel
  check_enum(config, "actor_rollout_ref.rollout.kv_cache_dtype", tuple(kv_quant.KV_CACHE_DTYPES))
  if config.actor_rollout_ref.rollout.quantization is not None:
    check_enum(config, "actor_rollout_ref.rollout.quantization", tuple(QUANTIZATIONS))
  check_enum(config, "actor_rollout_ref.model.remat_policy", remat.POLICIES)
  policy = config.actor_rollout_ref.model.remat_policy
  for node in ("actor_rollout_ref.model", "critic.model"):
    offloaded = get_node(config, node)
    check(not (offloaded.enable_activation_offload and offloaded.enable_gradient_checkpointing and policy != "full"),
          f"{node}.enable_activation_offload", True,
          f"keeps each layer's input alone in host memory, which needs remat_policy=full (it is {policy})",
          "set actor_rollout_ref.model.remat_policy=full, or drop the offload")
  check_enum(config, "actor_rollout_ref.model.attention_kernel", ("auto",) + attention.KERNELS)


def _check_profiler(config: ConfigDict) -> None:
  """global_profiler.steps: null or a list of step numbers (1-based, as verl counts steps)."""
  steps = config.global_profiler.steps
  check(steps is None or all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in steps),
        "global_profiler.steps", steps, "must be a list of step numbers (1 is the first step)",
        "e.g. global_profiler.steps=[2,3] with actor_rollout_ref.actor.profiler.enable=true")


def _check_unimplemented(config: ConfigDict) -> None:
  """Each `UNIMPLEMENTED_VALUES` key at its default (anything else would run something other than asked)."""
  base = get_base_config()
  for key, (problem, fix) in UNIMPLEMENTED_VALUES.items():
    value = get_node(config, key)
    check(value == get_node(base, key), key, value, problem, fix)


def _check_router_replay(config: ConfigDict) -> None:
  """The actor's router replay: disabled, R2, or R3 with the rollout recording its routing (verl's pair of keys)."""
  key, flag = "actor_rollout_ref.actor.router_replay.mode", "actor_rollout_ref.rollout.enable_rollout_routing_replay"
  mode, records = get_node(config, key), get_node(config, flag)
  check_enum(config, key, ("disabled", "R2", "R3"))
  check(mode != "R3" or records, key, mode, f"R3 replays the rollout's routing, which the rollout records only with "
        f"{flag}=true", f"set {flag}=true (verl asks for both)")
  check(mode == "R3" or not records, flag, records, f"the rollout's routing is replayed only by {key}=R3",
        f"set {key}=R3, or {flag}=false")


def _check_multi_turn(config: ConfigDict) -> None:
  """verl's multi_turn node: enums, limits, the tool and interaction files, and no routing replay with it."""
  node, key = config.actor_rollout_ref.rollout.multi_turn, "actor_rollout_ref.rollout.multi_turn"
  check_enum(config, "actor_rollout_ref.rollout.agent.default_agent_loop", AGENT_LOOPS)
  if not node.enable:
    return
  check_enum(config, f"{key}.format", TOOL_CALL_FORMATS)
  check_enum(config, f"{key}.tool_response_truncate_side", TRUNCATE_SIDES)
  check_enum(config, f"{key}.tokenization_sanity_check_mode", SANITY_CHECK_MODES)
  check(config.data.return_raw_chat, "data.return_raw_chat", config.data.return_raw_chat,
        "multi-turn rollouts continue each prompt's chat messages, which the batches hold only with it",
        "set data.return_raw_chat=true (as verl's multi-turn recipes do)")
  for name in ("max_parallel_calls", "max_tool_response_length", "tool_timeout_s"):
    check_positive(config, f"{key}.{name}")
  for name in ("max_assistant_turns", "max_user_turns"):
    value = node[name]
    check(value is None or (is_int(value) and value >= 1), f"{key}.{name}", value, "must be null or an integer >= 1",
          f"set {key}.{name}=null (no limit but the response length) or a positive number")
  for name in ("tool_config_path", "interaction_config_path", "function_tool_path"):
    path = node[name]
    check(path is None or os.path.isfile(os.path.expanduser(path)), f"{key}.{name}", path, "is not a file",
          f"point {key}.{name} at a Python file of @function_tool functions" if name == "function_tool_path"
          else f"point {key}.{name} at a YAML file in verl's format")
  check(not config.actor_rollout_ref.rollout.ignore_eos, "actor_rollout_ref.rollout.ignore_eos", True,
        "a multi-turn conversation's turns end at the end-of-turn token, which ignore_eos decodes past",
        "set actor_rollout_ref.rollout.ignore_eos=false")
  check(not config.actor_rollout_ref.rollout.enable_rollout_routing_replay,
        "actor_rollout_ref.rollout.enable_rollout_routing_replay", True,
        "the engine does not record the experts of the tokens a multi-turn rollout appends",
        "set it to false (router_replay.mode=R2 replays the old-log-prob pass instead)")


def _check_dynamic_sampling(config: ConfigDict) -> None:
  """DAPO's dynamic sampling: a metric to filter on. Without it, data.gen_batch_size as verl 0.9.1's V1 trainer
  reads it: in sync mode, the chunks a step's train_batch_size prompts are fetched in (a divisor; the same prompts
  whatever its value), in the async modes nothing (verl sets it to 1: prompt by prompt, as rljax streams)."""
  groups, data = config.algorithm.filter_groups, config.data
  check_positive(config, "data.gen_batch_size")
  if not groups.enable:
    check(config.trainer.v1.trainer_mode != "sync" or data.train_batch_size % data.gen_batch_size == 0,
          "data.gen_batch_size", data.gen_batch_size,
          f"does not divide data.train_batch_size ({data.train_batch_size}): without dynamic sampling, verl 0.9.1's "
          "V1 trainer fetches a step's prompts in whole gen_batch_size chunks",
          "set it to a divisor of data.train_batch_size; trainer.use_v1=false to train on gen_batch_size prompts "
          "per step (verl's legacy trainer); or algorithm.filter_groups.enable=true (and its metric)")
    return
  check(isinstance(groups.metric, str) and bool(groups.metric), "algorithm.filter_groups.metric", groups.metric,
        "dynamic sampling needs the per-response value whose spread decides which groups to keep",
        "set algorithm.filter_groups.metric=reward (verl 0.9's default: the summed score; or acc, score, "
        "seq_reward, seq_final_reward)")
  check(not (groups.metric == "seq_final_reward" and config.algorithm.use_kl_in_reward),
        "algorithm.filter_groups.metric", groups.metric,
        "the final reward with use_kl_in_reward needs old and reference log-probs of every generated response, "
        "which rljax computes after filtering", "use algorithm.filter_groups.metric=seq_reward (the score)")
  check(isinstance(groups.max_num_gen_batches, int), "algorithm.filter_groups.max_num_gen_batches",
        groups.max_num_gen_batches, "must be an integer", "set it to 0 for no limit")


def _check_sum_pi_squared(config: ConfigDict) -> None:
  """The optimal-token-baseline estimators read Σ_v π_v² of the old-log-prob pass: verl computes it only with
  actor.calculate_sum_pi_squared (and fails its step without it), and its bypass mode runs no such pass."""
  alg, actor = config.algorithm, config.actor_rollout_ref.actor
  if alg.adv_estimator not in kernel_names.sum_pi_squared_estimators():
    return
  check(actor.calculate_sum_pi_squared is True, "actor_rollout_ref.actor.calculate_sum_pi_squared",
        actor.calculate_sum_pi_squared,
        f"algorithm.adv_estimator={alg.adv_estimator} reads the sum of squared token probabilities, which the "
        "old-log-prob pass computes only when asked", "set actor_rollout_ref.actor.calculate_sum_pi_squared=true")
  check(not alg.rollout_correction.bypass_mode, "algorithm.rollout_correction.bypass_mode",
        alg.rollout_correction.bypass_mode,
        f"algorithm.adv_estimator={alg.adv_estimator} reads the sum of squared token probabilities of the "
        "old-log-prob pass, which bypass mode skips (it takes the rollout's log-probs as the old ones)",
        "set algorithm.rollout_correction.bypass_mode=false")


def _check_algorithm(config: ConfigDict) -> None:
  alg, actor = config.algorithm, config.actor_rollout_ref.actor
  check_enum(config, "algorithm.adv_estimator", kernel_names.adv_estimators())
  check_enum(config, "algorithm.kl_penalty", kernel_names.kl_types())
  check_enum(config, "algorithm.kl_ctrl.type", KL_CONTROLLERS)
  check_enum(config, "actor_rollout_ref.actor.kl_loss_type", kernel_names.kl_types())
  check_enum(config, "actor_rollout_ref.actor.loss_agg_mode", kernel_names.loss_agg_modes())
  check_enum(config, "critic.loss_agg_mode", kernel_names.loss_agg_modes())
  check_enum(config, "actor_rollout_ref.actor.policy_loss.loss_mode", kernel_names.policy_losses())
  _check_sum_pi_squared(config)
  from rljax.algos import pf_ppo  # pylint: disable=import-outside-toplevel
  if pf_ppo.applies(alg.use_pf_ppo, alg.adv_estimator):
    check_enum(config, "algorithm.pf_ppo.reweight_method", pf_ppo.METHODS)
    check(is_number(alg.pf_ppo.weight_pow), "algorithm.pf_ppo.weight_pow", alg.pf_ppo.weight_pow,
          "must be a number (the exponent of the pow weighting)", "e.g. algorithm.pf_ppo.weight_pow=2.0")
  for key in ("algorithm.gamma", "algorithm.lam"):
    check_range(config, key, 0.0, 1.0)
  for key in ("actor_rollout_ref.actor.clip_ratio", "actor_rollout_ref.actor.clip_ratio_low",
              "actor_rollout_ref.actor.clip_ratio_high", "actor_rollout_ref.actor.entropy_coeff",
              "actor_rollout_ref.actor.kl_loss_coef", "algorithm.kl_ctrl.kl_coef",
              "actor_rollout_ref.actor.grad_clip", "critic.cliprange_value"):
    check_positive(config, key, allow_zero=True)
  check(actor.clip_ratio_c > 1.0, "actor_rollout_ref.actor.clip_ratio_c", actor.clip_ratio_c,
        "dual-clip needs a lower bound > 1", "set actor_rollout_ref.actor.clip_ratio_c=3.0")
  check_positive(config, "actor_rollout_ref.actor.ppo_epochs")
  _warn_of_singleton_groups(alg.adv_estimator, config.actor_rollout_ref.rollout.n)
  check(not (kernel_names.needs_values(alg.adv_estimator) and config.critic.enable is False), "critic.enable", False,
        f"algorithm.adv_estimator={alg.adv_estimator} needs a critic for its values",
        "set critic.enable=null (auto) or choose a critic-free estimator such as grpo")
  for key in ("algorithm.rollout_is_level", "actor_rollout_ref.actor.rollout_is_level"):
    check_enum(config, key, ROLLOUT_IS_LEVELS)
  for key in ("algorithm.rollout_is_mode", "actor_rollout_ref.actor.rollout_is_mode"):
    check_enum(config, key, ROLLOUT_IS_MODES)


# verl 0.9.1's FSDP optimizer keys that its Megatron optimizer config does not have: key -> verl's default
FSDP_SCHEDULE_KEYS = {"lr_scheduler_type": "constant", "min_lr_ratio": 0.0, "num_cycles": 0.5,
                      "zero_indexed_step": True, "warmup_style": None}


def _check_schedule_engine(config: ConfigDict, role: str) -> None:
  """A role's schedule keys belong to its strategy's optimizer: Megatron's (lr_decay_style, min_lr, ...) under
  megatron, FSDP's (lr_scheduler_type, min_lr_ratio, ...) otherwise; the other engine's at a value other than
  verl's default is an error (verl's config for that engine has no such key)."""
  strategy = get_node(config, f"{role}.strategy")
  optim = get_node(config, f"{role}.optim")
  if strategy == "megatron":
    for key, default in FSDP_SCHEDULE_KEYS.items():
      check(optim[key] == default, f"{role}.optim.{key}", optim[key],
            f"is FSDP's; with {role}.strategy=megatron verl's Megatron optimizer sets the schedule",
            f"use {role}.optim.lr_decay_style, min_lr and lr_warmup_init (Megatron's scheduler), or "
            f"{role}.strategy=fsdp")
    return
  defaults = engines.optim(0.0, 0.0)
  for key in engines.MEGATRON_SCHEDULE_KEYS:
    check(optim[key] == defaults[key], f"{role}.optim.{key}", optim[key],
          f"is read by verl's Megatron engine only; {role}.strategy={strategy}",
          f"set {role}.strategy=megatron for Megatron's scheduler, or use {role}.optim.lr_scheduler_type, "
          "lr_warmup_steps and min_lr_ratio")


def _check_optim(config: ConfigDict) -> None:
  for role in ("actor_rollout_ref.actor", "critic"):
    _check_schedule_engine(config, role)
  _check_frozen_routers(config)


def _check_frozen_routers(config: ConfigDict) -> None:
  """Megatron's freeze_moe_router: read under actor.strategy=megatron (verl's FSDP engine does not read it); a
  critic's is not implemented."""
  strategy = config.actor_rollout_ref.actor.strategy
  frozen = routers_frozen(config)
  if frozen is not None:
    check(strategy == "megatron", frozen[0], frozen[1],
          f"is read by verl's Megatron engine only; with actor_rollout_ref.actor.strategy={strategy} verl trains the "
          "routers", f"set actor_rollout_ref.actor.strategy=megatron, or {frozen[0]}=false")
  critic = routers_frozen(config, "critic")
  if critic is not None:
    raise ConfigError(critic[0], critic[1], "freezing a mixture-of-experts critic's routers is not implemented",
                      f"set {critic[0]}=false")
  for prefix in ("actor_rollout_ref.actor.optim", "critic.optim"):
    check_enum(config, f"{prefix}.lr_scheduler_type", LR_SCHEDULERS)
    check_positive(config, f"{prefix}.lr", allow_zero=True)
    check_positive(config, f"{prefix}.weight_decay", allow_zero=True)
    check_range(config, f"{prefix}.lr_warmup_steps_ratio", 0.0, 1.0)
    check_range(config, f"{prefix}.min_lr_ratio", 0.0, 1.0)
    check_positive(config, f"{prefix}.num_cycles", allow_zero=True)
    name = get_node(config, f"{prefix}.optimizer")
    check(str(name).lower() in ADAM_NAMES, f"{prefix}.optimizer", name,
          "rljax's optimizer is optax's AdamW (decoupled weight decay)", f"set {prefix}.optimizer=AdamW")


def _check_trainer(config: ConfigDict) -> None:
  trainer = config.trainer
  check_enum(config, "trainer.resume_mode", RESUME_MODES)
  device = trainer.device
  check(device != "npu", "trainer.device", device,
        "npu is Huawei's Ascend NPU, which JAX has no backend for (verl runs it through torch_npu)",
        f"run on GPUs or TPUs: set trainer.device to one of {', '.join(DEVICES)}")
  check_enum(config, "trainer.device", DEVICES)
  check_enum(config, "data.truncation", TRUNCATIONS)
  check_enum(config, "reward_model.reward_manager", REWARD_MANAGERS)
  check_positive(config, "trainer.total_epochs")
  if trainer.total_training_steps is not None:
    check_positive(config, "trainer.total_training_steps")
  for key in ("trainer.save_freq", "trainer.test_freq"):
    value = get_node(config, key)
    check(value == -1 or value > 0, key, value, "must be -1 (never) or a positive step count", f"set {key}=-1 or a step count")
  check(trainer.resume_mode != "resume_path" or bool(trainer.resume_from_path), "trainer.resume_from_path",
        trainer.resume_from_path, "trainer.resume_mode=resume_path needs a checkpoint path",
        "set trainer.resume_from_path=DIR or trainer.resume_mode=auto")
  loggers = trainer.logger if isinstance(trainer.logger, (list, tuple)) else [trainer.logger]
  for name in loggers:
    check(name in LOGGERS, "trainer.logger", list(loggers), f"{name!r} is not a logger rljax has", f"choose from {', '.join(LOGGERS)}")
  for key in ("actor_rollout_ref.actor.checkpoint.save_contents", "critic.checkpoint.save_contents"):
    contents = get_node(config, key)
    bad = [c for c in contents if c not in CHECKPOINT_CONTENTS]
    check(not bad, key, list(contents), f"unknown entries {bad}", f"choose from {', '.join(CHECKPOINT_CONTENTS)}")
  for key in ("data.train_max_samples", "data.val_max_samples"):
    value = get_node(config, key)
    check(value == -1 or value > 0, key, value, "must be -1 (all rows) or a positive count", f"set {key}=-1")
  check_positive(config, "data.filter_overlong_prompts_workers")


def _check_trainer_mode(config: ConfigDict) -> None:
  """trainer.v1: the mode, and the asynchronous modes' staleness and weight-sync settings."""
  v1, key = config.trainer.v1, "trainer.v1.trainer_mode"
  check_enum(config, key, TRAINER_MODES)
  if v1.trainer_mode == "sync":
    return
  check_enum(config, "trainer.v1.sampler.max_off_policy_strategy", OFF_POLICY_STRATEGIES)
  threshold = v1.sampler.max_off_policy_threshold
  check(is_int(threshold) and threshold >= 1, "trainer.v1.sampler.max_off_policy_threshold", threshold,
        "must be a whole number of policy versions, at least 1 (1: on-policy)", "set it to 1 or more")
  mode = v1.trainer_mode
  ahead = v1[mode].num_warmup_batches
  check(is_int(ahead) and ahead >= 0, f"trainer.v1.{mode}.num_warmup_batches", ahead,
        "must be a whole number of batches, 0 or more", "set it to 0 or more")
  if mode != "separate_async":
    return
  separate = v1.separate_async
  check(is_int(separate.parameter_sync_step) and separate.parameter_sync_step >= 1,
        "trainer.v1.separate_async.parameter_sync_step", separate.parameter_sync_step,
        "must be a whole number of updates, at least 1", "set it to 1 (weights sent after every update) or more")
  check(v1.sampler.max_off_policy_strategy == "drop" or ahead == 0, "trainer.v1.sampler.max_off_policy_strategy",
        v1.sampler.max_off_policy_strategy, "wait, under separate_async with num_warmup_batches >= 1: the groups "
        "admitted ahead all start under the same older weights and could be due at one update, more than a batch",
        "set it to drop, or trainer.v1.separate_async.num_warmup_batches=0")
  spanned = ahead + separate.parameter_sync_step
  check(threshold >= spanned, "trainer.v1.sampler.max_off_policy_threshold", threshold,
        f"is below the {spanned} policy versions a group spans under separate_async's schedule (a batch decodes "
        f"under weights up to num_warmup_batches + parameter_sync_step - 1 = {spanned - 1} updates older than "
        "the one that trains it: drop would evict groups whose replacements are no fresher, wait could not train)",
        f"set it to {spanned} or more, or lower trainer.v1.separate_async.num_warmup_batches or parameter_sync_step")


def _check_cache_length(config: ConfigDict) -> None:
  rollout = config.actor_rollout_ref.rollout
  needed = config.data.max_prompt_length + rollout.response_length
  check(rollout.max_model_len is None or rollout.max_model_len >= needed, "actor_rollout_ref.rollout.max_model_len",
        rollout.max_model_len, f"is shorter than a prompt and its response ({needed} tokens)",
        f"set it to at least {needed} or null")


def _check_reward_model(config: ConfigDict) -> None:
  rm = config.reward_model
  if not rm.enable:
    return
  if rm.max_length is not None:
    check_positive(config, "reward_model.max_length")
  own_tokens = rm.model.input_tokenizer not in (None, config.actor_rollout_ref.model.path)
  check(not own_tokens or config.data.return_raw_chat, "data.return_raw_chat", config.data.return_raw_chat,
        "reward_model.model.input_tokenizer differs from the actor's, so the chat must be re-rendered "
        "from the prompt messages", "set data.return_raw_chat=true, or reward_model.model.input_tokenizer=null "
        "when both models share a tokenizer")


def _check_overlong_buffer(config: ConfigDict) -> None:
  """DAPO's max_resp_len (verl's reward_model.reward_kwargs.max_resp_len) is where rljax's penalty ramp ends."""
  limit, length = config.reward_model.overlong_buffer.max_resp_len, config.data.max_response_length
  check(limit is None or limit == length, "reward_model.overlong_buffer.max_resp_len", limit,
        f"differs from data.max_response_length ({length}), the length at which rljax's overlong penalty is full",
        f"set them equal: reward_model.overlong_buffer.max_resp_len={length} "
        f"(verl's +reward_model.reward_kwargs.max_resp_len) or data.max_response_length={limit}")


def _check_data_files(config: ConfigDict) -> None:
  check_data_files(config, "data.train_files")
  check_data_files(config, "data.val_files", required=False)


def _check_model_overrides(config: ConfigDict) -> None:
  """The HF fields of override_config.model_config must change the model rljax builds (or change nothing)."""
  from rljax.models import config as model_config  # pylint: disable=import-outside-toplevel
  prefix = "actor_rollout_ref.model.override_config.model_config"
  for name, value in get_node(config, prefix).to_dict().items():
    check(model_config.override_applies(name, value), f"{prefix}.{name}", value,
          "is a Hugging Face config field rljax's models do not read, so the override would not change the "
          "model here as it does in verl",
          f"drop it; rljax reads {', '.join(sorted(model_config.READ_FIELDS))} (dropout fields may be 0: "
          "rljax's models have no dropout)")


def model_path_keys(config: ConfigDict) -> list[str]:
  """The keys naming the models an RL run loads.

  The actor's; the critic's where it has one (critic.enable, by default
  algorithm.adv_estimator=gae); the reward model's where it is enabled.
  """
  keys = ["actor_rollout_ref.model.path"]
  if has_a_critic(config):
    keys.append("critic.model.path")
  if config.reward_model.enable:
    keys.append("reward_model.model.path")
  return keys


def _check_model_paths(config: ConfigDict) -> None:
  for key in model_path_keys(config):
    check_model_path(key, get_node(config, key), vision_language=key == "actor_rollout_ref.model.path")
  _check_vision_language(config)


def _check_vision_language(config: ConfigDict) -> None:
  """A vision-language actor: refuses what its images do not reach yet (each a config error naming the key)."""
  arr = config.actor_rollout_ref
  model_type = vision_language_type(arr.model.path)
  if model_type is None:
    return
  why = f"actor_rollout_ref.model.path is a vision-language model ({model_type}), and "
  check(not has_a_critic(config), "critic.enable", config.critic.enable,
        why + "a critic reading its images is not implemented yet", "use a critic-free estimator (grpo, rloo, ...)")
  check(not config.reward_model.enable, "reward_model.enable", True,
        why + "a reward model reading its images is not implemented yet", "score with a reward function")
  check(not arr.rollout.multi_turn.enable, "actor_rollout_ref.rollout.multi_turn.enable", True,
        why + "multi-turn rollouts with images are not implemented yet", "set it false")
  if int(arr.model.lora_rank) > 0:
    from rljax.models import lora  # pylint: disable=import-outside-toplevel
    lora.check_tower_left_out(lora.LoRAConfig.from_model_config(arr.model), model_type, why)


def check_mtp(config: ConfigDict, mtp_layers: int | None) -> None:
  """actor_rollout_ref.model.mtp: enable needs a model with multi-token prediction layers (`mtp_layers`, None
  where not known yet), and training them is not implemented under LoRA."""
  model = config.actor_rollout_ref.model
  if not model.mtp.enable:
    return
  check(mtp_layers is None or mtp_layers > 0, "actor_rollout_ref.model.mtp.enable", True,
        f"{model.path} has no multi-token prediction layers (rljax reads MiMo's: model_type mimo with "
        "num_nextn_predict_layers > 0)", "set it false, or point actor_rollout_ref.model.path at such a model")
  check(not (model.mtp.enable_train and int(model.lora_rank) > 0), "actor_rollout_ref.model.mtp.enable_train", True,
        "training the multi-token prediction layers beside LoRA adapters is not implemented",
        "set it false (the layers are then loaded and saved unchanged), or train without LoRA")


def _check_lora(config: ConfigDict) -> None:
  from rljax.models import lora  # pylint: disable=import-outside-toplevel
  lora.check_lora_keys(config.actor_rollout_ref.model)


def _warn_of_singleton_groups(estimator: str, n: int) -> None:
  """A group estimator with one response per prompt runs as verl runs it (each group a singleton: GRPO's mean 0 and
  std 1, so the advantage is the score; RLOO's the score; see rljax.algos), with a warning (once: a run validates
  more than once): nothing is compared."""
  if estimator in kernel_names.group_estimators() and n == 1:
    warn_once(f"singleton groups of {estimator}",
              f"actor_rollout_ref.rollout.n=1: algorithm.adv_estimator={estimator} compares the responses of a "
              "prompt, and each prompt has one: as in verl, each is a group of its own (no baseline; GRPO's "
              "advantage is the score over 1 + 1e-6). Set actor_rollout_ref.rollout.n to 2 or more (e.g. 5) to "
              "compare them")


def _check_mesh(config: ConfigDict, world_size: int | None) -> None:
  actor = config.actor_rollout_ref.actor
  for key in ("actor_rollout_ref.actor.tensor_model_parallel_size",
              "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
              "actor_rollout_ref.actor.megatron.expert_model_parallel_size",
              "actor_rollout_ref.rollout.tensor_model_parallel_size"):
    check_positive(config, key)
  fsdp = actor.fsdp_config.fsdp_size
  check(fsdp == -1 or fsdp > 0, "actor_rollout_ref.actor.fsdp_config.fsdp_size", fsdp, "must be -1 (all remaining devices) or positive", "set it to -1")
  if world_size is None:
    return
  from rljax.sharding.mesh import mesh_shape  # pylint: disable=import-outside-toplevel  (no jax at import)
  mesh_shape(config, world_size)
  tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
  check(world_size % tp == 0, "actor_rollout_ref.rollout.tensor_model_parallel_size", tp,
        f"does not divide the {world_size} devices", f"set it to a divisor of {world_size}")


def validate(config: ConfigDict, world_size: int | None = None) -> ConfigDict:
  """Checks every cross-key rule; raises ConfigError on the first failure.

  Args:
    config: a finalized config.
    world_size: devices in the job; enables the per-device divisibility and
      mesh rules (None checks only what does not depend on devices).

  Returns:
    The config, unchanged.
  """
  _check_mesh(config, world_size)
  _check_lengths(config)
  _check_chat_template_kwargs(config)
  _check_custom_chat_template(config)
  _check_batches(config)
  _check_sampling(config)
  _check_algorithm(config)
  _check_unimplemented(config)
  _check_router_replay(config)
  _check_multi_turn(config)
  _check_profiler(config)
  _check_dynamic_sampling(config)
  _check_optim(config)
  _check_trainer(config)
  _check_trainer_mode(config)
  _check_reward_model(config)
  _check_overlong_buffer(config)
  _check_data_files(config)
  _check_model_paths(config)
  _check_model_overrides(config)
  _check_cache_length(config)
  _check_lora(config)
  check_mtp(config, mtp_layers_of(config.actor_rollout_ref.model.path))
  return config
