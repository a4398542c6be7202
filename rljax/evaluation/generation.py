"""Offline generation: `data.n_samples` responses to every prompt of a parquet file.

verl's `main_generation` on rljax's pieces. Each row's chat messages
(`data.prompt_key`) are templated and tokenised as the RL data path does
(`rljax.data.tokenization`); a prompt longer than `rollout.prompt_length` is
an error naming its row unless `data.truncation` is left, right or middle.
Prompts go `data.batch_size` at a time through `RolloutSampler.generate`
over a JetStream engine (the trainer's rollout), with the sampling keys of
`rollout.*` (temperature, top_k, top_p, do_sample, response_length,
ignore_eos). Responses are decoded with special tokens skipped, as verl
decodes them.

A vision-language model's prompts may hold images (`data.image_key`, verl's
multimodal parquet, prepared as the RL data prepares them): each prompt is
prefilled with its images once for its samples.

The model is `model.path` (an HF directory, a .gguf file or an alias) or, with
`model.checkpoint`, the actor of an rljax run: its latest complete step (or
the `global_step_N` directory named), on the architecture and tokenizer of
the run's saved config (`rljax.export.restore_actor`), in its saved dtype.

The output (`data.output_path`, default `NAME-responses.parquet` beside the
input) is the input table with a `responses` column: row i holds the
`data.n_samples` decoded responses to prompt i (a list of strings), which
`rljax.eval` reads with its default `data.response_key`. An input column of
that name is replaced, as verl replaces it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Sequence

import jax
import numpy as np
import pyarrow as pa
from flax import nnx
from jax.sharding import Mesh
from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import export
from rljax import models
from rljax import sharding
from rljax.data import dataset as dataset_lib
from rljax.data import images as images_lib
from rljax.data import tokenization
from rljax.evaluation import cli
from rljax.evaluation import table as table_lib
from rljax.rollout import RolloutSampler, factory as rollout_factory
from rljax.sharding import hosts
from rljax.sharding.distributed import is_main_process
from rljax.training import checkpointing

RESPONSES_COLUMN = table_lib.RESPONSES_COLUMN
_LOG = logging.getLogger(cli.LOGGER_NAME)


@dataclasses.dataclass
class Policy:
  """What generates: a model, its parameters on the mesh, its tokenizer.

  Attributes:
    model: the CausalLM (graph and config).
    params: `nnx.state(model, nnx.Param)`, placed on the mesh.
    tokenizer: see `rljax.data.tokenization`.
    source: where the parameters came from, for the log.
  """

  model: models.CausalLM
  params: Any
  tokenizer: Any
  source: str


def output_path(config: ConfigDict) -> str:
  """`data.output_path`, or `NAME-responses.parquet` beside `data.path`."""
  if config.data.output_path:
    return os.path.abspath(os.path.expanduser(config.data.output_path))
  return table_lib.beside(config.data.path, "-responses.parquet")


def fit_prompt(ids: Sequence[int], max_length: int, truncation: str, where: str) -> list[int]:
  """One prompt's ids, at most `max_length` long.

  Args:
    ids: L token ids.
    max_length: P, `rollout.prompt_length`.
    truncation: `data.truncation`; "error" refuses L > P, the others cut as
      `rljax.data.tokenization.truncate` does.
    where: 'FILE row N', for the message.

  Raises:
    ValueError: L > P with truncation "error", naming the row and the keys.
  """
  if len(ids) > max_length and truncation == "error":
    raise ValueError(
        f"{where}: the templated prompt is {len(ids)} tokens, longer than rollout.prompt_length={max_length}. "
        "Raise rollout.prompt_length or set data.truncation to left, right or middle.")
  return tokenization.truncate(ids, max_length, truncation, where)


def encode_prompts(messages: Sequence[Any], tokenizer: Any, prompt_key: str, max_length: int,
                   truncation: str, source: str, images: Sequence[Any] | None = None,
                   processor: images_lib.ImageProcessing | None = None) -> list[list[int]]:
  """Chat messages of N rows -> N lists of prompt token ids (templated, unpadded). With a vision-language model's
  `processor`, `images` [N] holds each row's `prompt_images` (or None): its `<image>` placeholders become the
  image tokens, as the RL data makes them, and a prompt with images is never cut.

  Raises:
    ValueError: naming the row, for malformed messages, placeholders that do not match the images, or an over-long
      prompt.
  """
  prompts = []
  for row, value in enumerate(messages):
    where = table_lib.describe_row(source, row)
    chat = dataset_lib.check_messages(value, where, prompt_key)
    pictures = None if images is None else images[row]
    if pictures is not None:
      chat = dataset_lib.expand_images(chat, [images_lib.image_tokens(g, processor) for g in pictures[1]], where)
    ids = tokenization.encode_text(tokenizer, tokenization.chat_prompt(tokenizer, chat))
    if pictures is not None and len(ids) > max_length:
      raise ValueError(f"{where}: the templated prompt is {len(ids)} tokens with its images', longer than "
                       f"rollout.prompt_length={max_length}; a prompt with images is never cut. Raise "
                       "rollout.prompt_length or lower the images' max_pixels.")
    prompts.append(fit_prompt(ids, max_length, truncation, where))
  return prompts


def prompt_images(values: Sequence[Any], processor: images_lib.ImageProcessing, patch_size: int, source: str,
                  image_key: str) -> list[tuple[np.ndarray, np.ndarray] | None]:
  """Each row's (pixel_values, image_grid_thw) from its `data.image_key` entries (None: no image), prepared as the
  RL data prepares them; an unreadable image is an error naming its row."""
  out = []
  for row, value in enumerate(values):
    try:
      out.append(images_lib.prompt_images(dataset_lib.media_entries(value), processor, patch_size))
    except ValueError as e:
      raise ValueError(f"{table_lib.describe_row(source, row)}: column {image_key!r}: {e}") from e
  return out


def read_images(table: pa.Table, config: ConfigDict, source: str) -> tuple[list[Any] | None, Any]:
  """(each row's `prompt_images` or None for a text model's prompts, the model's image processing or None).

  Raises:
    ValueError: naming the first row with images when the model is a text model.
  """
  key = config.data.image_key
  processor = images_lib.ImageProcessing.of_model(model_directory(config))
  if processor is None:
    row = dataset_lib.first_media_row(table, key)
    if row is not None:
      raise ValueError(f"{table_lib.describe_row(source, row)}: column {key!r} (data.image_key) holds images, and "
                       "the model has no preprocessor_config.json: it is a text model. Generate with a "
                       "vision-language model (Qwen2.5-VL, Qwen3-VL) from its full directory, or drop the column.")
    return None, None
  if key not in table.column_names:
    return None, processor
  return prompt_images(table.column(key).to_pylist(), processor, int(config.data.image_patch_size), source,
                       key), processor


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """B prompts -> (ids [B, L], mask [B, L]) int32, left-padded to the longest, L."""
  width = max(len(p) for p in prompts)
  rows = [tokenization.left_pad(p, width, pad_id)[:2] for p in prompts]
  return np.stack([r[0] for r in rows]), np.stack([r[1] for r in rows])


def decode_responses(responses: np.ndarray, lengths: np.ndarray, n: int, tokenizer: Any) -> list[list[str]]:
  """Rollout rows -> texts per prompt.

  Args:
    responses: [B * n, R] token ids; row p * n + j is sample j of prompt p.
    lengths: [B * n] generated token counts.
    n: samples per prompt.
    tokenizer: decodes with special tokens skipped.

  Returns:
    B lists of n strings.
  """
  texts = [tokenization.decode_ids(tokenizer, row[:length]) for row, length in zip(responses, lengths)]
  return [texts[p * n:(p + 1) * n] for p in range(len(texts) // n)]


def generate_responses(sampler: RolloutSampler, params: Any, prompts: Sequence[Sequence[int]], n: int,
                       batch_size: int, key: jax.Array, tokenizer: Any,
                       images: Sequence[Any] | None = None) -> list[list[str]]:
  """n decoded responses per prompt, `batch_size` prompts per sampler call, every host's.

  On several hosts each batch's prompts are split over them (`hosts.share`) and each host generates its
  share on its own devices: response j of the batch's prompt i samples as request i * n + j of the batch,
  so the responses are the ones one process generates, which every host then receives.

  Args:
    sampler: the rollout sampler (its engine holds the sampling settings).
    params: the model parameters.
    prompts: B prompts' token ids.
    n: responses per prompt.
    batch_size: prompts per `sampler.generate` call.
    key: PRNG key; batch b samples with `fold_in(key, b)`.
    tokenizer: decodes the responses.
    images: B prompts' (pixel_values, image_grid_thw) or None each (`prompt_images`); None: text prompts.

  Returns:
    B lists of n strings, in prompt order.
  """
  out: list[list[str]] = []
  count = -(-len(prompts) // batch_size)
  for b in range(count):
    chunk = prompts[b * batch_size:(b + 1) * batch_size]
    part = hosts.share(len(chunk))
    _LOG.info("batch %d/%d: %d prompts x %d samples", b + 1, count, part.stop - part.start, n)
    mine: list[list[str]] = []
    if part.stop > part.start:
      ids, mask = pad_prompts(chunk[part], sampler.pad_id)
      rows = None
      if images is not None:
        mine_images = images[b * batch_size:(b + 1) * batch_size][part]
        rows = {"multi_modal_inputs": dataset_lib.object_array(
            [None if i is None else {"pixel_values": i[0], "image_grid_thw": i[1]} for i in mine_images])}
      rollout = sampler.generate(params, ids, mask, n, jax.random.fold_in(key, b), first_request=part.start * n,
                                 rows=rows)
      mine = decode_responses(rollout.responses, rollout.response_lengths, n, tokenizer)
    out.extend(responses for host in hosts.process_objects(mine) for responses in host)
  return out


def with_responses(table: pa.Table, responses: Sequence[Sequence[str]]) -> pa.Table:
  """`table` plus a `responses` column (list<string>), replacing one of that name."""
  column = pa.array([list(r) for r in responses], pa.list_(pa.string()))
  if RESPONSES_COLUMN in table.column_names:
    return table.set_column(table.column_names.index(RESPONSES_COLUMN), RESPONSES_COLUMN, column)
  return table.append_column(RESPONSES_COLUMN, column)


def checkpoint_location(path: str) -> tuple[str, int | None]:
  """`model.checkpoint` -> (run directory, step).

  A global_step_N directory names its step; a run directory gives None (its
  latest complete step).
  """
  path = checkpointing.absolute(path.rstrip("/"))
  if os.path.basename(path).startswith(checkpointing.STEP_PREFIX + "_"):
    return checkpointing.split_step_path(path)
  return path, None


def model_directory(config: ConfigDict) -> str:
  """The model's directory: model.path, or the model the run of model.checkpoint trained."""
  if config.model.checkpoint:
    return export.load_run_config(checkpoint_location(config.model.checkpoint)[0]).actor_rollout_ref.model.path
  return config.model.path


def tokenizer_source(config: ConfigDict) -> tuple[str, str | None]:
  """(data.tokenizer, else the tokenizer the run of model.checkpoint trained with, else model.path; the chat
  template the run of model.checkpoint trained with, its custom_chat_template, or None)."""
  if config.data.tokenizer:
    return config.data.tokenizer, None
  if config.model.checkpoint:
    run = export.load_run_config(checkpoint_location(config.model.checkpoint)[0])
    return config_lib.get_node(run, config_lib.tokenizer_key(run)), run.actor_rollout_ref.model.get(
        "custom_chat_template")
  return config.model.path, None


def load_tokenizer(config: ConfigDict) -> Any:
  """The tokenizer `tokenizer_source` names, rendering the run's chat template where it trained with one; a missing
  one names the key behind it."""
  key = "data.tokenizer" if config.data.tokenizer else "model.checkpoint" if config.model.checkpoint else "model.path"
  try:
    path, template = tokenizer_source(config)
    tokenizer = models.load_tokenizer(os.path.expanduser(path))
  except FileNotFoundError as e:
    raise FileNotFoundError(f"{key}={config_lib.get_node(config, key)}: {e}") from e
  return tokenizer if template is None else tokenizer.with_chat_template(template)


def make_mesh(config: ConfigDict) -> tuple[Mesh, list[tuple[str, Any]]]:
  """(mesh, logical-axis rules) over trainer.n_gpus_per_node devices of this process (each host's own: on
  several hosts, trainer.nnodes of them, each generates its share).

  The rollout's tensor axis is `rollout.tensor_model_parallel_size`; the
  rest of the devices split the decode slots (data axis). The rules are the
  trainer's defaults.

  Raises:
    ConfigError: more devices asked for than JAX sees, or a tensor size
      that does not divide them.
  """
  devices = jax.local_devices()
  sharding.resolve_world_size(config, len(devices))  # checks trainer.nnodes and n_gpus_per_node
  per_node = config.trainer.n_gpus_per_node
  world = len(devices) if per_node == "auto" or config.trainer.nnodes == "auto" else per_node
  _check_devices(world, len(devices), per_node)
  tensor = config.rollout.tensor_model_parallel_size
  if world % tensor:
    raise config_lib.ConfigError("rollout.tensor_model_parallel_size", tensor, f"does not divide the {world} devices",
                                 f"choose a divisor of {world}")
  mesh = sharding.build_mesh({"data": world // tensor, "fsdp": 1, "tensor": tensor, "sequence": 1}, devices[:world])
  return mesh, sharding.rules_from_config(config_lib.get_base_config())


def _check_devices(wanted: int, available: int, per_node: Any) -> None:
  if wanted > available:
    raise config_lib.ConfigError(
        "trainer.n_gpus_per_node", per_node, f"asks for {wanted} devices but JAX sees {available}",
        "set trainer.n_gpus_per_node=auto to use every visible device")


def _restore_checkpoint(path: str) -> tuple[models.CausalLM, str]:
  directory, step = checkpoint_location(path)
  try:
    model, _, step = export.restore_actor(directory, step)
  except FileNotFoundError as e:
    raise FileNotFoundError(f"model.checkpoint={path}: {e}") from e
  return model, checkpointing.step_dir(directory, step)


def load_policy(config: ConfigDict, mesh: Mesh, rules: Any, tokenizer: Any) -> Policy:
  """The model of `model.checkpoint` (if set) or `model.path`, parameters placed on `mesh`."""
  if config.model.checkpoint:
    model, source = _restore_checkpoint(config.model.checkpoint)
  else:
    source = os.path.expanduser(config.model.path)
    try:
      model = models.from_pretrained(source, dtype=rollout_factory.dtype_of(config.rollout.dtype), mesh=mesh,
                                     rules=rules,
                                     attention_kernel=rollout_factory.attention_kernel(config.rollout.attention_kernel,
                                                                                       mesh))
    except FileNotFoundError as e:
      raise FileNotFoundError(f"model.path={config.model.path}: {e}") from e
  sharding.check_model_fits(mesh, model.cfg.num_heads, model.cfg.num_kv_heads, "rollout.tensor_model_parallel_size")
  params = nnx.state(model, nnx.Param)
  params = sharding.shard_like(params, sharding.param_shardings(params, mesh, rules))
  return Policy(model=model, params=params, tokenizer=tokenizer, source=source)


def make_sampler(policy: Policy, config: ConfigDict, mesh: Mesh, rules: Any) -> RolloutSampler:
  """The JetStream engine and RolloutSampler for `rollout.*`, built as the trainer builds them."""
  rollout = config.rollout
  stop = rollout_factory.stop_ids(policy.tokenizer, policy.model.cfg)
  engine = rollout_factory.build_engine(
      policy.model, rollout, prompt_length=rollout.prompt_length, mesh=mesh, rules=rules, stop=stop,
      slots=min(rollout.max_num_seqs, config.data.batch_size * config.data.n_samples))
  return rollout_factory.build_sampler(engine, rollout, rollout_factory.pad_id(policy.tokenizer, stop))


def run(config: ConfigDict) -> str:
  """Generates for every row of `data.path` and writes the output parquet.

  Args:
    config: a validated generation config (`rljax.evaluation.config`).

  Returns:
    The output path.
  """
  source = os.path.abspath(os.path.expanduser(config.data.path))
  table = table_lib.read_table(source)
  if table.num_rows == 0:
    raise ValueError(f"{source} has no rows to generate for (data.path).")
  table_lib.require_columns(table, {"data.prompt_key": config.data.prompt_key}, source)
  tokenizer = load_tokenizer(config)
  images, processor = read_images(table, config, source)
  prompts = encode_prompts(table.column(config.data.prompt_key).to_pylist(), tokenizer, config.data.prompt_key,
                           config.rollout.prompt_length, config.data.truncation, source, images, processor)
  mesh, rules = make_mesh(config)
  policy = load_policy(config, mesh, rules, tokenizer)
  _LOG.info("%d prompts from %s, model %s on %d device(s)", len(prompts), source, policy.source, mesh.size)
  sampler = make_sampler(policy, config, mesh, rules)
  responses = generate_responses(sampler, policy.params, prompts, config.data.n_samples, config.data.batch_size,
                                 jax.random.key(config.trainer.seed), tokenizer, images)
  if not is_main_process():
    return output_path(config)
  path = table_lib.write_parquet(with_responses(table, responses), output_path(config))
  _LOG.info("wrote %s", path)
  return path
