"""verl's PPO-trainer configuration tree as an ml_collections ConfigDict.

The public API of the config package, one module per concern:

* `tree` builds the default tree (`get_base_config`) from one module per
  verl node (`data`, `actor_rollout_ref`, `critic`, `reward`, `algorithm`,
  `trainer`) and the engine configs they share (`engines`); `fields` holds
  the building blocks (typed fields, verl's `${...}` links, dotted paths).
* `keys` holds one record per key (`KEYS`): what it means and what rljax
  does with it where not what verl does (ignored, mapped, added by rljax,
  accepted at verl's default only, deprecated). The tables `IGNORED_KEYS`,
  `MAPPED_KEYS`, `RLJAX_KEYS`, `UNIMPLEMENTED_VALUES`, `DEPRECATED_KEYS` and
  docs/configuration.md (`rljax.docs_reference`) are generated from it.
* `overrides` sets keys: both override syntaxes (`--config.a.b=v` and
  verl's `a.b=v`) with one parser, Hydra's `+a.b=v`, `++a.b=v` and `~a.b`,
  verl's free-form dictionaries (`VERL_FREE_FORM`) and YAML trees.
* `mapping.finalize` maps deprecated keys and verl's other spellings onto
  the keys rljax reads, warning once per deprecated key.
* `validation.validate` checks every cross-key rule before any work starts
  and raises `ConfigError`, which names the key, the bad value and the fix;
  `checks` holds the public check helpers the SFT and evaluation configs
  share, `lora` the LoRA keys' defaults (their checks: `rljax.models.lora`), `choices` the values of
  enum keys and `kernel_names` the algorithm names of the kernel registries.
* `yaml_io` reads and writes YAML as verl does; `verl_yaml` loads a verl
  `ppo_trainer.yaml` file onto the tree (its `${...}` kept as links); `cli`
  finds the config on the command line (experiment files, verl YAML files,
  Hydra's `--config-path/--config-name`).
"""

from ml_collections import ConfigDict

from rljax.config import kernel_names
from rljax.config.checks import check_data_files, check_enum, check_model_path, check_positive, check_range
from rljax.config.choices import (
    ADAM_NAMES, CHECKPOINT_CONTENTS, CPU_DOT_LIBRARIES, DEVICES, DTYPES, GRAD_CLIP_DEFAULT, KL_CONTROLLERS, LOGGERS,
    LR_SCHEDULERS, RESUME_MODES, REWARD_MANAGERS, ROLLOUT_IS_LEVELS, ROLLOUT_IS_MODES, ROLLOUT_NAMES, TRUNCATIONS,
    AGENT_LOOPS, SANITY_CHECK_MODES, TOOL_CALL_FORMATS, TRUNCATE_SIDES,
)
from rljax.config.cli import (
    HYDRA_CONFIG_DIR, HYDRA_CONFIG_FLAGS, VERL_YAML_SUFFIXES, hydra_config_file, load_config_file, split_overrides,
)
from rljax.config.engines import MEGATRON_MESH_KEYS, PROFILED_SECTIONS
from rljax.config.errors import NO_VALUE, ConfigError, check, is_int, is_number
from rljax.config.fields import any_value, follow, get_node, null, tokenizer_key
from rljax.config.keys import (
    DEPRECATED_KEYS, IGNORED_KEYS, IGNORED_SECTIONS, KEYS, MAPPED_KEYS, RLJAX_KEYS, UNIMPLEMENTED_VALUES, Key,
    ignored_reason,
)
from rljax.config.lora import lora_defaults
from rljax.config.mapping import data_parallel_size, finalize
from rljax.config.overrides import (
    DICT_FIELDS, VERL_FREE_FORM, add_value, apply_overrides, free_form_dicts, from_yaml, ignored_overrides,
    parse_override, reset_value, set_value, verl_free_form_path,
)
from rljax.config.tree import OPEN_DICTS, get_base_config, leaf_paths, unknown_key_error
from rljax.config.validation import model_path_keys, validate
from rljax.config.yaml_io import YamlLoader, parse_yaml, to_plain, to_yaml

# The kernel registries' names under the constant names the config once
# listed itself; each is read from `rljax.algos` (and JAX) when first asked for.
_KERNEL_NAMES = {
    "ADV_ESTIMATORS": kernel_names.adv_estimators,
    "POLICY_LOSSES": kernel_names.policy_losses,
    "GROUP_ESTIMATORS": kernel_names.group_estimators,
    "SUM_PI_SQUARED_ESTIMATORS": kernel_names.sum_pi_squared_estimators,
    "LOSS_AGG_MODES": kernel_names.loss_agg_modes,
    "KL_TYPES": kernel_names.kl_types,
}


def __getattr__(name: str):
  """`ADV_ESTIMATORS` and the other `_KERNEL_NAMES`, read from the kernel registries."""
  if name in _KERNEL_NAMES:
    return _KERNEL_NAMES[name]()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADAM_NAMES", "AGENT_LOOPS", "CHECKPOINT_CONTENTS", "CPU_DOT_LIBRARIES", "ConfigDict", "ConfigError", "DEPRECATED_KEYS",
    "DEVICES", "DICT_FIELDS", "DTYPES", "GRAD_CLIP_DEFAULT", "HYDRA_CONFIG_DIR", "HYDRA_CONFIG_FLAGS",
    "IGNORED_KEYS", "IGNORED_SECTIONS", "KEYS", "KL_CONTROLLERS", "Key", "LOGGERS",
    "LR_SCHEDULERS", "MAPPED_KEYS", "MEGATRON_MESH_KEYS", "NO_VALUE", "OPEN_DICTS",
    "PROFILED_SECTIONS", "RESUME_MODES", "REWARD_MANAGERS", "RLJAX_KEYS", "ROLLOUT_IS_LEVELS", "ROLLOUT_IS_MODES",
    "ROLLOUT_NAMES", "SANITY_CHECK_MODES", "TOOL_CALL_FORMATS", "TRUNCATE_SIDES", "TRUNCATIONS", "UNIMPLEMENTED_VALUES", "VERL_FREE_FORM", "VERL_YAML_SUFFIXES", "YamlLoader",
    "add_value", "any_value", "apply_overrides", "check", "check_data_files", "check_enum",
    "check_model_path", "check_positive", "check_range", "data_parallel_size", "finalize", "follow",
    "free_form_dicts", "from_yaml", "get_base_config", "get_node", "hydra_config_file", "ignored_overrides",
    "ignored_reason", "is_int", "is_number", "kernel_names", "leaf_paths", "load_config_file", "lora_defaults",
    "model_path_keys", "null", "parse_override", "parse_yaml", "reset_value",
    "set_value", "split_overrides", "to_plain", "to_yaml", "tokenizer_key", "unknown_key_error", "validate", "verl_free_form_path",
]
