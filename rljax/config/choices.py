"""The values enum keys of the RL tree accept (algorithm names come from `kernel_names`)."""

TRUNCATIONS = ("error", "left", "right", "middle")
TRAINER_MODES = ("sync", "colocate_async", "separate_async")
OFF_POLICY_STRATEGIES = ("drop", "wait")
RESUME_MODES = ("auto", "disable", "resume_path")
LR_SCHEDULERS = ("constant", "cosine")
KL_CONTROLLERS = ("fixed", "adaptive")
REWARD_MANAGERS = ("naive", "prime", "dapo", "batch")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
# verl's inference servers (vllm, sglang, trtllm, hf) all select rljax's JetStream-style engine, as jetstream does.
ROLLOUT_NAMES = ("jetstream", "vllm", "sglang", "trtllm", "hf")
CPU_DOT_LIBRARIES = ("auto", "ynnpack", "eigen")
DEVICES = ("auto", "cpu", "gpu", "cuda", "tpu")
ROLLOUT_IS_LEVELS = ("token", "sequence")
ROLLOUT_IS_MODES = ("truncate", "mask")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")
# `optim.optimizer` names that mean rljax's AdamW (verl's FSDP default, and Megatron's 'adam', also decoupled).
ADAM_NAMES = ("adamw", "adam")
# verl's default of `grad_clip` and `optim.clip_grad`.
GRAD_CLIP_DEFAULT = 1.0
DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
# multi-turn rollouts (actor_rollout_ref.rollout.multi_turn.*, rollout.agent.default_agent_loop)
TOOL_CALL_FORMATS = ("hermes", "llama3_json", "mistral", "qwen3_coder", "glm")
TRUNCATE_SIDES = ("left", "middle", "right")
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
AGENT_LOOPS = ("single_turn_agent", "tool_agent")
