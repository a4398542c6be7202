"""Exports a trained actor from an rljax checkpoint as a Hugging Face directory.

  python -m rljax.export --checkpoint DIR [--step N] --out HF_DIR [--format merged|peft]

It runs on one host: launched on every host (`JAX_PROCESS_ID` set), process
0 writes and the others exit. DIR is `trainer.default_local_dir` of the run:
it holds `config.yaml` (the run's resolved config) and `global_step_N/`
checkpoints. The architecture and
tokenizer come from `actor_rollout_ref.model.path` (an HF directory, a .gguf
file or an alias such as smollm2-135m-instruct) with the run's
`override_config.model_config` and `scan_layers`; the weights are the
checkpoint's "actor" arrays (`nnx.state(model, nnx.Param)`), written in
their saved dtype. The output opens with
`transformers.AutoModelForCausalLM.from_pretrained(HF_DIR)`.

A LoRA run (`actor_rollout_ref.model.lora_rank > 0`) saves only the adapters
and modules_to_save; export loads the base weights from `model.path`, adds
the run's adapters and either writes the merged model (W + scale * A @ B,
the default) or, with `--format peft`, PEFT's adapter directory
(adapter_config.json + adapter_model.safetensors) for
`peft.PeftModel.from_pretrained(base, HF_DIR)`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from typing import Any, Sequence

import jax
import numpy as np
from etils import epath
from flax import nnx
from ml_collections import ConfigDict

from rljax import config as config_lib
from rljax import models
from rljax.models import checkpoint as model_checkpoint
from rljax.models import config as model_config_lib
from rljax.models import gguf_io
from rljax.models import lora
from rljax.sharding import distributed
from rljax.training import checkpointing
from rljax.utils import platforms

ACTOR = "actor"
FORMATS = ("merged", "peft")


def load_run_config(checkpoint_dir: str) -> ConfigDict:
  """The run config saved beside the checkpoints (`DIR/config.yaml`)."""
  directory = epath.Path(checkpointing.absolute(checkpoint_dir))
  if not directory.is_dir():
    raise FileNotFoundError(f"checkpoint directory {directory} does not exist.")
  path = directory / checkpointing.CONFIG_FILE
  if not path.is_file():
    raise FileNotFoundError(
        f"{path} does not exist: export needs the run config saved beside the checkpoints "
        "(the trainer writes it; Checkpointer.save_config(config) writes it by hand)."
    )
  return config_lib.from_yaml(path.read_text())


def _hf_config(model_path: str) -> dict[str, Any]:
  if model_path.endswith(".gguf"):
    hf_config, _ = gguf_io.read_gguf(model_path)
    return dict(hf_config)
  return model_checkpoint.hf_config_from_dir(model_path)


def _names(tree: Any) -> dict[str, Any]:
  """'layers/0/attn/q' -> leaf, whatever the key types (dict keys, attributes)."""
  out = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    parts = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    out["/".join(p for p in parts if p != "value")] = leaf
  return out


def _check_matches(saved: Any, abstract: Any, where: str, model_path: str) -> None:
  saved_names, model_names = _names(saved), _names(abstract)
  missing = sorted(set(model_names) - set(saved_names))
  extra = sorted(set(saved_names) - set(model_names))
  if missing or extra:
    raise ValueError(
        f"{where}: the checkpoint's actor parameters do not match the model built from "
        f"actor_rollout_ref.model.path={model_path} (missing: {missing[:5]}, unexpected: "
        f"{extra[:5]}); check actor_rollout_ref.model.scan_layers, override_config and the LoRA keys "
        "(lora_rank, target_modules, r_pattern, modules_to_save) in config.yaml."
    )
  for name, leaf in model_names.items():
    if tuple(saved_names[name].shape) != tuple(leaf.shape):
      raise ValueError(
          f"{where}: actor parameter {name} has shape {tuple(saved_names[name].shape)} but the "
          f"model built from actor_rollout_ref.model.path={model_path} needs {tuple(leaf.shape)}."
      )


def _model_path(config: ConfigDict) -> str:
  """`actor_rollout_ref.model.path` resolved (~, aliases); errors name the key."""
  path = config.actor_rollout_ref.model.path
  try:
    return models.resolve_path(os.path.expanduser(path))
  except FileNotFoundError as e:
    raise FileNotFoundError(f"actor_rollout_ref.model.path={path} in the run config: {e}") from e


def _saved_dtype(saved: Any) -> np.dtype:
  return np.dtype(jax.tree.leaves(saved)[0].dtype)


def _lora_model(config: ConfigDict, model_path: str, dtype: np.dtype) -> models.CausalLM:
  """The run's base model (weights from `model.path`) with the run's adapters, freshly initialised."""
  model_cfg = config.actor_rollout_ref.model
  model = models.from_pretrained(model_path, dtype=dtype,
                                 override_config=model_cfg.override_config.model_config.to_dict(),
                                 scan_layers=model_cfg.scan_layers, mtp=bool(model_cfg.mtp.enable))
  return lora.apply_lora(model, lora.LoRAConfig.from_model_config(model_cfg))


def restore_actor(checkpoint_dir: str, step: int | None = None) -> tuple[models.CausalLM, ConfigDict, int]:
  """(actor model with the checkpoint's parameters, run config, step); with LoRA, the base model plus adapters."""
  config = load_run_config(checkpoint_dir)
  model_cfg = config.actor_rollout_ref.model
  model_path = _model_path(config)
  with checkpointing.Checkpointer(checkpoint_dir, read_only=True) as ckpt:
    step = ckpt.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(
          f"no complete checkpoint (global_step_N with {checkpointing.COMMIT_MARKER}) "
          f"under {checkpoint_dir}.")
    where = checkpointing.step_dir(ckpt.directory, step)
    metadata = ckpt.array_metadata(step)
    if ACTOR not in metadata:
      raise ValueError(f"{where} has no {ACTOR!r} arrays (it has {sorted(metadata)}).")
    dtype = _saved_dtype(metadata[ACTOR])
    if model_cfg.lora_rank > 0:
      graphdef, params, frozen = lora.split_trainable(_lora_model(config, model_path, dtype))
      _check_matches(metadata[ACTOR], params, where, model_path)
      arrays, _ = ckpt.restore(step, {ACTOR: params})
      return nnx.merge(graphdef, arrays[ACTOR], frozen), config, step
    cfg = model_config_lib.from_hf_dict(
        _hf_config(model_path), model_cfg.override_config.model_config.to_dict(),
        dtype=dtype, param_dtype=dtype, scan_layers=model_cfg.scan_layers, mtp=bool(model_cfg.mtp.enable),
    )
    abstract = nnx.eval_shape(lambda: models.CausalLM(cfg, nnx.Rngs(0)))
    graphdef, params = nnx.split(abstract, nnx.Param)
    _check_matches(metadata[ACTOR], params, where, model_path)
    arrays, _ = ckpt.restore(step, {ACTOR: params})
  return nnx.merge(graphdef, arrays[ACTOR]), config, step


def _tokenizer(model_path: str, chat_template: str | None = None) -> Any:
  """The model's tokenizer, rendering `chat_template` (the run's custom_chat_template) where one is given, as
  verl's checkpoints save it; None (and a line on stderr) where the model has none."""
  try:
    tokenizer = models.load_tokenizer(model_path)
  except FileNotFoundError as e:
    print(f"rljax.export: no tokenizer written ({e}).", file=sys.stderr)
    return None
  return tokenizer if chat_template is None else tokenizer.with_chat_template(chat_template)


def export(checkpoint_dir: str, out_dir: str, step: int | None = None, fmt: str = "merged") -> str:
  """Writes the actor of `step` (default: latest complete) under `checkpoint_dir` to `out_dir`.

  fmt: "merged" (a full HF model; LoRA adapters folded into their kernels)
  or "peft" (a LoRA run's PEFT adapter directory).
  """
  if fmt not in FORMATS:
    raise ValueError(f"--format {fmt!r}: expected one of {', '.join(FORMATS)}.")
  if fmt == "peft" and load_run_config(checkpoint_dir).actor_rollout_ref.model.lora_rank == 0:
    raise ValueError("--format peft needs a LoRA run (actor_rollout_ref.model.lora_rank > 0); this run trained "
                     "every parameter: export the merged model (the default).")
  model, config, step = restore_actor(checkpoint_dir, step)
  model_cfg = config.actor_rollout_ref.model
  if fmt == "peft":
    lora.save_peft(model, lora.LoRAConfig.from_model_config(model_cfg), out_dir, model_cfg.path)
    return out_dir
  plain = lora.merge_lora(model) if model_cfg.lora_rank > 0 else model
  source = config_lib.tokenizer_key(config)  # the run's tokenizer, written beside the weights
  tokenizer_path = (_model_path(config) if source == "actor_rollout_ref.model.path"
                    else os.path.expanduser(config_lib.get_node(config, source)))
  tokenizer = _tokenizer(tokenizer_path, model_cfg.get("custom_chat_template"))
  models.save_pretrained(plain, out_dir, tokenizer=tokenizer)
  if plain.cfg.vision is not None:  # a vision-language model's image processing goes with it
    _copy_image_processing(_model_path(config), out_dir)
  return out_dir


def _copy_image_processing(source: str, out_dir: str) -> None:
  """Copies `source`'s preprocessor_config.json (a vision-language model's image processing) into `out_dir`."""
  config = os.path.join(source, "preprocessor_config.json")
  if os.path.isfile(config):
    shutil.copyfile(config, os.path.join(out_dir, "preprocessor_config.json"))


def main(argv: Sequence[str] | None = None) -> None:
  platforms.skip_absent_tpu()  # no libtpu start-up noise on a host without a TPU
  parser = argparse.ArgumentParser(prog="python -m rljax.export", description=__doc__.split("\n")[0])
  parser.add_argument("--checkpoint", required=True, help="trainer.default_local_dir of the run")
  parser.add_argument("--step", type=int, default=None, help="global step (default: latest complete)")
  parser.add_argument("--out", required=True, help="output Hugging Face directory")
  parser.add_argument("--format", choices=FORMATS, default="merged",
                      help="merged: a full HF model (LoRA folded in); peft: a LoRA run's PEFT adapter")
  args = parser.parse_args(argv)
  if distributed.launch_index() > 0:  # a multi-process launch: one host writes the directory
    print(f"rljax.export: process {distributed.launch_index()} leaves the export to process 0")
    return
  try:
    out = export(args.checkpoint, args.out, args.step, args.format)
  except (FileNotFoundError, ValueError) as e:
    parser.exit(1, f"rljax.export: error: {e}\n")
  print(f"rljax.export: wrote {out}")


if __name__ == "__main__":
  main()
