#!/usr/bin/env bash
# Creates a Cloud TPU VM: one host (v6e-8, v5litepod-8, v4-8) or a multi-host
# pod slice (v5litepod-16, v4-32, ...), directly or as a queued resource.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

CLOUD_PLATFORM_SCOPE="https://www.googleapis.com/auth/cloud-platform"
SPOT=${RLJAX_TPU_SPOT:-0}
RESERVED=${RLJAX_TPU_RESERVED:-0}
SERVICE_ACCOUNT=${RLJAX_TPU_SERVICE_ACCOUNT:-}
CHECK=${RLJAX_TPU_CHECK:-}
CHECK_OVERRIDES=()
PYTHON=${RLJAX_PYTHON:-python3}

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME [settings]

Creates the TPU VM (every worker of a pod slice) with the cloud-platform
scope, so the workers can read and write your Cloud Storage bucket.

$COMMON_HELP
  --accelerator-type=TYPE RLJAX_TPU_TYPE      v6e-8, v5litepod-8, v5litepod-16, v4-32, ...
  --version=VERSION       RLJAX_TPU_VERSION   TPU software version; default by family:
                                              v6e v2-alpha-tpuv6e, v5litepod v2-alpha-tpuv5-lite,
                                              v5p v2-alpha-tpuv5, v2/v3/v4 tpu-ubuntu2204-base
  --queued                RLJAX_TPU_QUEUED=1  request it as a queued resource (waits for capacity)
  --qr-id=ID              RLJAX_TPU_QR_ID     queued resource id (default NAME-qr)
  --spot                  RLJAX_TPU_SPOT=1    Spot VMs (cheaper, can be preempted)
  --reserved              RLJAX_TPU_RESERVED=1 use the project's reserved capacity
  --service-account=EMAIL RLJAX_TPU_SERVICE_ACCOUNT  default: the Compute Engine default
  --check=CONFIG          RLJAX_TPU_CHECK     first compile every step of this run for the slice, here
                                              (python -m rljax.compile --topology=TYPE; needs rljax's
                                              tpu extra), and create nothing if a step does not fit,
                                              e.g. configs/grpo.py:llama3_1_8b_gsm8k
  --check-override=K=V                        an override for that run (repeatable)

Example:
  $SCRIPT_NAME --project=my-project --zone=us-east5-b --name=rljax-v6e --accelerator-type=v6e-8
EOF
}

while (($#)); do
  case $1 in
    --accelerator-type | --accelerator-type=*) take_value "$@"; ACCELERATOR_TYPE=$VALUE ;;
    --version | --version=*) take_value "$@"; RUNTIME_VERSION=$VALUE ;;
    --queued) QUEUED=1; SHIFT=1 ;;
    --qr-id | --qr-id=*) take_value "$@"; QR_ID=$VALUE ;;
    --spot) SPOT=1; SHIFT=1 ;;
    --reserved) RESERVED=1; SHIFT=1 ;;
    --service-account | --service-account=*) take_value "$@"; SERVICE_ACCOUNT=$VALUE ;;
    --check | --check=*) take_value "$@"; CHECK=$VALUE ;;
    --check-override | --check-override=*) take_value "$@"; CHECK_OVERRIDES+=("$VALUE") ;;
    *) common_flag "$@" ;;
  esac
  shift "$SHIFT"
done

require_target
require_accelerator_type
require_runtime_version
require_queued_id
[[ $SPOT == 0 || $SPOT == 1 ]] || die "bad RLJAX_TPU_SPOT '$SPOT': 1 (Spot VMs) or 0."
[[ $RESERVED == 0 || $RESERVED == 1 ]] || die "bad RLJAX_TPU_RESERVED '$RESERVED': 1 (reserved capacity) or 0."
[[ $SPOT == 0 || $RESERVED == 0 ]] || die "--spot and --reserved exclude each other: choose one capacity kind."
[[ -z $SERVICE_ACCOUNT || $SERVICE_ACCOUNT =~ ^[^@[:space:]]+@[^@[:space:]]+$ ]] \
  || die "bad service account '$SERVICE_ACCOUNT': an e-mail such as NAME@PROJECT.iam.gserviceaccount.com (--service-account / RLJAX_TPU_SERVICE_ACCOUNT)."

options=(--scopes="$CLOUD_PLATFORM_SCOPE")
[[ $SPOT == 1 ]] && options+=(--spot)
[[ $RESERVED == 1 ]] && options+=(--reserved)
[[ -n $SERVICE_ACCOUNT ]] && options+=(--service-account="$SERVICE_ACCOUNT")

[[ -n $CHECK || ${#CHECK_OVERRIDES[@]} == 0 ]] || die "--check-override needs --check=CONFIG (the run it overrides)."
if [[ -n $CHECK ]]; then
  note "checking that every step of $CHECK fits a $ACCELERATOR_TYPE before creating it"
  if ! run "$PYTHON" -m rljax.compile --config="$CHECK" --topology="$ACCELERATOR_TYPE" "${CHECK_OVERRIDES[@]}"; then
    die "$CHECK does not compile within a $ACCELERATOR_TYPE (see above); nothing was created. Change the run or --accelerator-type."
  fi
fi

note "$ACCELERATOR_TYPE: $(hosts "$ACCELERATOR_TYPE") worker(s), TPU software $RUNTIME_VERSION"
if [[ $QUEUED == 1 ]]; then
  run gcloud compute tpus queued-resources create "$QR_ID" --project="$PROJECT" --zone="$ZONE" \
    --node-id="$NAME" --accelerator-type="$ACCELERATOR_TYPE" --runtime-version="$RUNTIME_VERSION" \
    "${options[@]}"
  note "queued; the VM exists once the state is ACTIVE:"
  note "  gcloud compute tpus queued-resources describe $QR_ID --project=$PROJECT --zone=$ZONE"
else
  run gcloud compute tpus tpu-vm create "$NAME" --project="$PROJECT" --zone="$ZONE" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" "${options[@]}"
fi
note "next: setup.sh (install rljax on every worker)"
