#!/usr/bin/env bash
# Starts `python -m rljax.train` on every worker of a TPU VM at once
# (--worker=all). On a pod slice each worker runs the same command and
# rljax.sharding.initialize() finds the topology through JAX's TPU detection.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CONFIG=${RLJAX_TPU_CONFIG:-configs/grpo.py:qwen2_5_0_5b_gsm8k}
CHECKPOINT_DIR=${RLJAX_TPU_CHECKPOINT_DIR:-}
FOLLOW=${RLJAX_TPU_FOLLOW:-0}
read -r -a run_env <<<"${RLJAX_TPU_ENV:-}"
overrides=()

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME [settings] [KEY=VALUE | --config.KEY=VALUE ...] [-- KEY=VALUE ...]

On every worker: cd REMOTE_DIR and run, in the background under nohup,
  VENV/bin/python -m rljax.train --config=CONFIG [trainer.default_local_dir=CHECKPOINT_DIR] OVERRIDES
writing LOG_DIR/RUN_NAME.log and the process id to LOG_DIR/RUN_NAME.pid.
A worker where RUN_NAME's process is still alive refuses to start another.
Overrides are rljax.train's (verl's spelling or --config.KEY=VALUE).

$COMMON_HELP
  --config=FILE[:PRESET]  RLJAX_TPU_CONFIG    default configs/grpo.py:qwen2_5_0_5b_gsm8k
  --checkpoint-dir=DIR    RLJAX_TPU_CHECKPOINT_DIR  trainer.default_local_dir: gs://BUCKET/PATH
                                              (needed on a multi-host slice: every worker writes
                                              its shards there), or a path relative to REMOTE_DIR
  --accelerator-type=TYPE RLJAX_TPU_TYPE      when given, a multi-host TYPE must have a gs:// checkpoint dir
  --env=KEY=VALUE         RLJAX_TPU_ENV="K=V ..."  environment for the run (repeatable)
  --run-name=NAME         RLJAX_TPU_RUN_NAME  names the log and pid files (default train)
  --follow                RLJAX_TPU_FOLLOW=1  stay and print the log until the run ends
                                              (Ctrl-C stops following, not the run)
  --remote-dir=DIR        RLJAX_TPU_REMOTE_DIR   the code on the workers (default rljax)
  --venv=DIR              RLJAX_TPU_VENV      (default rljax-venv)
  --log-dir=DIR           RLJAX_TPU_LOG_DIR   (default rljax-logs)

Example:
  $SCRIPT_NAME --project=my-project --zone=us-east5-b --name=rljax-v6e \\
    trainer.total_training_steps=100 trainer.logger='[console,jsonl,tensorboard]'
EOF
}

while (($#)); do
  case $1 in
    --config | --config=*) take_value "$@"; CONFIG=$VALUE ;;
    --checkpoint-dir | --checkpoint-dir=*) take_value "$@"; CHECKPOINT_DIR=$VALUE ;;
    --accelerator-type | --accelerator-type=*) take_value "$@"; ACCELERATOR_TYPE=$VALUE ;;
    --env | --env=*) take_value "$@"; run_env+=("$VALUE") ;;
    --run-name | --run-name=*) take_value "$@"; RUN_NAME=$VALUE ;;
    --follow) FOLLOW=1; SHIFT=1 ;;
    --remote-dir | --remote-dir=*) take_value "$@"; REMOTE_DIR=$VALUE ;;
    --venv | --venv=*) take_value "$@"; VENV=$VALUE ;;
    --log-dir | --log-dir=*) take_value "$@"; LOG_DIR=$VALUE ;;
    --config.*=*) overrides+=("$1"); SHIFT=1 ;;
    --) shift; overrides+=("$@"); SHIFT=$# ;;
    -*) common_flag "$@" ;;
    *=*) overrides+=("$1"); SHIFT=1 ;;
    *) die "unexpected argument '$1': overrides are KEY=VALUE or --config.KEY=VALUE (see --help)" ;;
  esac
  shift "$SHIFT"
done

require_target
require_run_name
require_remote_path "remote dir" "$REMOTE_DIR" --remote-dir RLJAX_TPU_REMOTE_DIR
require_remote_path "venv" "$VENV" --venv RLJAX_TPU_VENV
require_remote_path "log dir" "$LOG_DIR" --log-dir RLJAX_TPU_LOG_DIR
[[ $FOLLOW == 0 || $FOLLOW == 1 ]] || die "bad RLJAX_TPU_FOLLOW '$FOLLOW': 1 (print the log) or 0."
[[ $CONFIG =~ ^[^:[:space:]]+\.py(:[A-Za-z0-9_]+)?$ ]] \
  || die "bad config '$CONFIG': an experiment file and an optional preset, e.g. configs/grpo.py:qwen2_5_0_5b_gsm8k (--config / RLJAX_TPU_CONFIG)."
for pair in "${run_env[@]}"; do
  [[ $pair =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "bad environment entry '$pair': KEY=VALUE (--env / RLJAX_TPU_ENV)."
done
for override in "${overrides[@]}"; do
  [[ $override =~ ^(--config\.)?[A-Za-z_+~][A-Za-z0-9_.]*= ]] \
    || die "bad override '$override': KEY=VALUE or --config.KEY=VALUE, e.g. data.train_batch_size=256."
  if [[ $override =~ ^(--config\.)?trainer\.default_local_dir=(.*)$ ]]; then
    [[ -z $CHECKPOINT_DIR ]] || die "the checkpoint directory is given twice: --checkpoint-dir and $override; keep one."
    CHECKPOINT_DIR=${BASH_REMATCH[2]}
  fi
done
train_args=(--config="$CONFIG")
if [[ -n $CHECKPOINT_DIR ]]; then
  if [[ $CHECKPOINT_DIR == gs://* ]]; then
    check_gcs_uri "checkpoint dir" "$CHECKPOINT_DIR" --checkpoint-dir RLJAX_TPU_CHECKPOINT_DIR
  fi
  train_args+=("trainer.default_local_dir=$CHECKPOINT_DIR")
fi
for override in "${overrides[@]}"; do
  [[ $override =~ ^(--config\.)?trainer\.default_local_dir= ]] || train_args+=("$override")
done
if [[ -n $ACCELERATOR_TYPE ]]; then
  check_accelerator_type
  workers=$(hosts "$ACCELERATOR_TYPE")
  if ((workers > 1)) && [[ $CHECKPOINT_DIR != gs://* ]]; then
    die "$ACCELERATOR_TYPE has $workers workers, which must share one checkpoint directory: pass --checkpoint-dir=gs://BUCKET/PATH (or export RLJAX_TPU_CHECKPOINT_DIR)."
  fi
fi

log=$(remote_path "$(log_file)")
pid=$(remote_path "$(pid_file)")
env_words=""
for pair in "${run_env[@]}"; do
  env_words+="${pair%%=*}=$(quote "${pair#*=}") "
done
train="$(remote_path "$VENV")/bin/python -m rljax.train $(quote_all "${train_args[@]}")"
start="{ ${env_words}nohup $train > $log 2>&1 < /dev/null & echo \$! > $pid"
if [[ $FOLLOW == 1 ]]; then
  start+="; tail --pid=\$! -n +1 -F $log"
fi
start+="; }"
running="if test -f $pid && kill -0 \"\$(cat $pid)\" 2>/dev/null; then"
running+=" echo $(quote "run $RUN_NAME is still going: stop.sh --run-name=$RUN_NAME stops it") >&2; exit 1; fi"
tpu_ssh all "mkdir -p $(remote_path "$LOG_DIR") && cd $(remote_path "$REMOTE_DIR") && $running && $start"
if [[ $FOLLOW == 0 ]]; then
  note "started on every worker; follow with: logs.sh --run-name=$RUN_NAME (worker 0 prints the metrics)"
fi
