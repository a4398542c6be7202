#!/usr/bin/env bash
# Copies a run's checkpoints between the TPU VM and a Cloud Storage bucket,
# or from the bucket to this machine.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

BUCKET=${RLJAX_TPU_BUCKET:-}
CHECKPOINT_DIR=${RLJAX_TPU_CHECKPOINT_DIR:-checkpoints/rljax_gsm8k/grpo_qwen2_5_0_5b_gsm8k}
LOCAL_DIR=${RLJAX_TPU_LOCAL_DIR:-}
DIRECTION=""
IN_FLIGHT='.*orbax-checkpoint-tmp.*'

usage() {
  cat <<EOF2
Usage: $SCRIPT_NAME to-bucket|from-bucket|to-local [settings]

  to-bucket    worker 0's CHECKPOINT_DIR -> BUCKET (gcloud storage rsync; saves
               still in flight are skipped; safe while the run goes on)
  from-bucket  BUCKET -> CHECKPOINT_DIR on every worker, to resume on a new VM
  to-local     BUCKET -> LOCAL_DIR on this machine (e.g. for python -m rljax.export)

rsync copies what is missing or changed and deletes nothing.

$COMMON_HELP
  --bucket=gs://B/PATH    RLJAX_TPU_BUCKET    the checkpoints' place in Cloud Storage
  --checkpoint-dir=DIR    RLJAX_TPU_CHECKPOINT_DIR  the run's trainer.default_local_dir on the
                                              workers, relative to REMOTE_DIR (default
                                              checkpoints/rljax_gsm8k/grpo_qwen2_5_0_5b_gsm8k,
                                              the qwen2_5_0_5b_gsm8k preset's)
  --remote-dir=DIR        RLJAX_TPU_REMOTE_DIR   the code on the workers (default rljax)
  --local-dir=DIR         RLJAX_TPU_LOCAL_DIR to-local's destination (default CHECKPOINT_DIR,
                                              relative to the current directory)
(to-local needs only --bucket.)

Example:
  $SCRIPT_NAME to-bucket --project=my-project --zone=us-east5-b --name=rljax-v6e \\
    --bucket=gs://my-bucket/rljax/grpo_qwen2_5_0_5b_gsm8k
EOF2
}

while (($#)); do
  case $1 in
    to-bucket | from-bucket | to-local)
      [[ -z $DIRECTION ]] || die "two directions given ($DIRECTION and $1): choose one."
      DIRECTION=$1
      SHIFT=1
      ;;
    --bucket | --bucket=*) take_value "$@"; BUCKET=$VALUE ;;
    --checkpoint-dir | --checkpoint-dir=*) take_value "$@"; CHECKPOINT_DIR=$VALUE ;;
    --remote-dir | --remote-dir=*) take_value "$@"; REMOTE_DIR=$VALUE ;;
    --local-dir | --local-dir=*) take_value "$@"; LOCAL_DIR=$VALUE ;;
    *) common_flag "$@" ;;
  esac
  shift "$SHIFT"
done

require_dry_run_flag
[[ -n $DIRECTION ]] || die "missing direction: to-bucket, from-bucket or to-local (see --help)."
[[ -n $BUCKET ]] || missing "bucket (where checkpoints go in Cloud Storage)" --bucket RLJAX_TPU_BUCKET gs://my-bucket/rljax
check_gcs_uri "bucket" "$BUCKET" --bucket RLJAX_TPU_BUCKET
BUCKET=${BUCKET%/}
[[ -n $CHECKPOINT_DIR && $CHECKPOINT_DIR != *$'\n'* ]] \
  || die "bad checkpoint dir '$CHECKPOINT_DIR' (--checkpoint-dir / RLJAX_TPU_CHECKPOINT_DIR)."

if [[ $DIRECTION == to-local ]]; then
  if [[ -z $LOCAL_DIR && $CHECKPOINT_DIR == gs://* ]]; then
    die "missing setting: local dir (the checkpoint dir is in Cloud Storage, so it gives no local path). Pass --local-dir=DIR or export RLJAX_TPU_LOCAL_DIR=DIR."
  fi
  LOCAL_DIR=${LOCAL_DIR:-$CHECKPOINT_DIR}
  run mkdir -p "$LOCAL_DIR"
  run gcloud storage rsync --recursive "$BUCKET" "$LOCAL_DIR"
  exit 0
fi

[[ $CHECKPOINT_DIR != gs://* ]] \
  || die "checkpoint dir '$CHECKPOINT_DIR' is already in Cloud Storage: nothing to copy to or from the workers (to-local --bucket=$CHECKPOINT_DIR --local-dir=DIR copies it here)."

require_target
require_remote_path "remote dir" "$REMOTE_DIR" --remote-dir RLJAX_TPU_REMOTE_DIR
if [[ $CHECKPOINT_DIR == \~/* ]]; then
  checkpoints=$(remote_path "${CHECKPOINT_DIR#\~/}")
else
  checkpoints=$(quote "$CHECKPOINT_DIR")
fi
in_code="cd $(remote_path "$REMOTE_DIR")"
if [[ $DIRECTION == to-bucket ]]; then
  tpu_ssh 0 "$in_code && gcloud storage rsync --recursive --exclude=$(quote "$IN_FLIGHT") $checkpoints $(quote "$BUCKET")"
else
  tpu_ssh all "$in_code && mkdir -p $checkpoints && gcloud storage rsync --recursive $(quote "$BUCKET") $checkpoints"
fi
