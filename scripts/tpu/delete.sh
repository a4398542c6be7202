#!/usr/bin/env bash
# Deletes the TPU VM (every worker), or the queued resource and its VM.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

YES=${RLJAX_TPU_YES:-0}

usage() {
  cat <<EOF2
Usage: $SCRIPT_NAME [settings]

Deletes the TPU VM; with --queued, deletes the queued resource together with
its VM (--force). Its disks go with it: copy checkpoints out first
(sync_checkpoints.sh to-bucket) unless they were written to gs://.
gcloud asks before deleting unless --yes.

$COMMON_HELP
  --queued                RLJAX_TPU_QUEUED=1  the VM came from create.sh --queued
  --qr-id=ID              RLJAX_TPU_QR_ID     queued resource id (default NAME-qr)
  --yes                   RLJAX_TPU_YES=1     do not ask (gcloud --quiet)
EOF2
}

while (($#)); do
  case $1 in
    --queued) QUEUED=1; SHIFT=1 ;;
    --qr-id | --qr-id=*) take_value "$@"; QR_ID=$VALUE ;;
    --yes) YES=1; SHIFT=1 ;;
    *) common_flag "$@" ;;
  esac
  shift "$SHIFT"
done

require_target
require_queued_id
[[ $YES == 0 || $YES == 1 ]] || die "bad RLJAX_TPU_YES '$YES': 1 (do not ask) or 0."

options=()
if [[ $YES == 1 ]]; then
  options+=(--quiet)
fi
if [[ $QUEUED == 1 ]]; then
  run gcloud compute tpus queued-resources delete "$QR_ID" --project="$PROJECT" --zone="$ZONE" \
    --force "${options[@]}"
else
  run gcloud compute tpus tpu-vm delete "$NAME" --project="$PROJECT" --zone="$ZONE" "${options[@]}"
fi
