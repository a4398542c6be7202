#!/usr/bin/env bash
# Installs rljax on every worker of a TPU VM: Python, the code (this checkout
# or a git clone), a virtual environment with `pip install -e` plus jax[tpu];
# optionally copies the model and the data from Cloud Storage to every worker.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
REPO_URL=${RLJAX_TPU_REPO_URL:-}
REF=${RLJAX_TPU_REF:-}
PYTHON=${RLJAX_TPU_PYTHON:-python3.11}
PIP_EXTRAS=${RLJAX_TPU_PIP_EXTRAS:-jax[tpu] gcsfs}
MODEL_SRC=${RLJAX_TPU_MODEL_SRC:-}
MODEL_DIR=${RLJAX_TPU_MODEL_DIR:-models/Qwen2.5-0.5B-Instruct}
DATA_SRC=${RLJAX_TPU_DATA_SRC:-}
DATA_DIR=${RLJAX_TPU_DATA_DIR:-data/gsm8k}
ARCHIVE_NAME=rljax-src.tar.gz

usage() {
  cat <<EOF
Usage: $SCRIPT_NAME [settings]

On every worker (--worker=all): installs PYTHON and its venv module if
missing (apt), puts the code in REMOTE_DIR, makes the virtual environment
VENV and runs pip install -e REMOTE_DIR plus PIP_EXTRAS in it. Without
--repo-url the code
is REF (default HEAD) of this checkout, packed with git archive and copied
with scp; commit your changes first. Run it again after a code change.

$COMMON_HELP
  --repo-url=URL          RLJAX_TPU_REPO_URL  clone this git repository on the workers instead
  --ref=REF               RLJAX_TPU_REF       branch, tag or commit (default: HEAD here, main for --repo-url)
  --remote-dir=DIR        RLJAX_TPU_REMOTE_DIR   the code on the workers (default rljax)
  --venv=DIR              RLJAX_TPU_VENV      virtual environment on the workers (default rljax-venv)
  --python=EXE            RLJAX_TPU_PYTHON    Python 3.11 or newer (default python3.11)
  --pip-extras="PKG ..."  RLJAX_TPU_PIP_EXTRAS   installed beside rljax (default "jax[tpu] gcsfs";
                                              gcsfs lets checkpoints go straight to gs://)
  --model-src=gs://...    RLJAX_TPU_MODEL_SRC copy this HF model directory to MODEL_DIR on every worker
  --model-dir=DIR         RLJAX_TPU_MODEL_DIR (default models/Qwen2.5-0.5B-Instruct, the preset's path)
  --data-src=gs://...     RLJAX_TPU_DATA_SRC  copy this folder of parquet files to DATA_DIR on every worker
  --data-dir=DIR          RLJAX_TPU_DATA_DIR  (default data/gsm8k, the preset's path)

Example:
  $SCRIPT_NAME --project=my-project --zone=us-east5-b --name=rljax-v6e \\
    --model-src=gs://my-bucket/models/Qwen2.5-0.5B-Instruct --data-src=gs://my-bucket/data/gsm8k
EOF
}

while (($#)); do
  case $1 in
    --repo-url | --repo-url=*) take_value "$@"; REPO_URL=$VALUE ;;
    --ref | --ref=*) take_value "$@"; REF=$VALUE ;;
    --remote-dir | --remote-dir=*) take_value "$@"; REMOTE_DIR=$VALUE ;;
    --venv | --venv=*) take_value "$@"; VENV=$VALUE ;;
    --python | --python=*) take_value "$@"; PYTHON=$VALUE ;;
    --pip-extras | --pip-extras=*) take_value "$@"; PIP_EXTRAS=$VALUE ;;
    --model-src | --model-src=*) take_value "$@"; MODEL_SRC=$VALUE ;;
    --model-dir | --model-dir=*) take_value "$@"; MODEL_DIR=$VALUE ;;
    --data-src | --data-src=*) take_value "$@"; DATA_SRC=$VALUE ;;
    --data-dir | --data-dir=*) take_value "$@"; DATA_DIR=$VALUE ;;
    *) common_flag "$@" ;;
  esac
  shift "$SHIFT"
done

require_target
require_remote_path "remote dir" "$REMOTE_DIR" --remote-dir RLJAX_TPU_REMOTE_DIR
require_remote_path "venv" "$VENV" --venv RLJAX_TPU_VENV
[[ $PYTHON =~ ^python3\.(1[1-9]|[2-9][0-9])$ ]] \
  || die "bad python '$PYTHON': rljax needs Python 3.11 or newer, named like python3.11 (--python / RLJAX_TPU_PYTHON)."
read -r -a pip_extras <<<"$PIP_EXTRAS"
if [[ -n $REPO_URL ]]; then
  [[ $REPO_URL =~ ^(https://|ssh://|git@|file://) ]] \
    || die "bad repo url '$REPO_URL': an https://, ssh://, git@ or file:// git URL (--repo-url / RLJAX_TPU_REPO_URL)."
  REF=${REF:-main}
else
  REF=${REF:-HEAD}
fi
[[ $REF =~ ^[A-Za-z0-9][A-Za-z0-9_./^~-]*$ ]] || die "bad ref '$REF': a branch, tag or commit (--ref / RLJAX_TPU_REF)."
if [[ -n $MODEL_SRC ]]; then
  check_gcs_uri "model source" "$MODEL_SRC" --model-src RLJAX_TPU_MODEL_SRC
  require_remote_path "model dir" "$MODEL_DIR" --model-dir RLJAX_TPU_MODEL_DIR
fi
if [[ -n $DATA_SRC ]]; then
  check_gcs_uri "data source" "$DATA_SRC" --data-src RLJAX_TPU_DATA_SRC
  require_remote_path "data dir" "$DATA_DIR" --data-dir RLJAX_TPU_DATA_DIR
fi

code=$(remote_path "$REMOTE_DIR")
venv_python="$(remote_path "$VENV")/bin/python"

if [[ -n $REPO_URL ]]; then
  fetch_code="{ test -d $code/.git || git clone --quiet $(quote "$REPO_URL") $code; }"
  fetch_code+=" && git -C $code fetch --quiet origin $(quote "$REF")"
  fetch_code+=" && git -C $code checkout --quiet --detach FETCH_HEAD"
else
  archive="${TMPDIR:-/tmp}/$ARCHIVE_NAME"
  remote_archive=$(remote_path "$ARCHIVE_NAME")
  run git -C "$REPO_ROOT" archive --format=tar.gz --output="$archive" "$REF"
  run gcloud compute tpus tpu-vm scp "$archive" "$NAME:$ARCHIVE_NAME" --project="$PROJECT" \
    --zone="$ZONE" --worker=all
  run rm -f "$archive"
  fetch_code="mkdir -p $code && tar -xzf $remote_archive -C $code && rm -f $remote_archive"
fi

apt_get="sudo env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600"
install="{ $PYTHON -c 'import ensurepip' >/dev/null 2>&1 || { $apt_get update -qq && $apt_get install -y -qq $PYTHON $PYTHON-venv; }; }"
install+=" && $fetch_code"
install+=" && $PYTHON -m venv $(remote_path "$VENV")"
install+=" && $venv_python -m pip install --quiet --upgrade pip"
install+=" && $venv_python -m pip install --quiet -e $code"
if ((${#pip_extras[@]})); then
  install+=" $(quote_all "${pip_extras[@]}")"
fi
install+=" && $venv_python -c 'import jax, rljax' && echo rljax installed"
tpu_ssh all "$install"

# copy_to_workers SRC DIR: rsync the gs:// folder SRC into DIR on every worker.
copy_to_workers() {
  local dir
  dir=$(remote_path "$2")
  tpu_ssh all "mkdir -p $dir && gcloud storage rsync --recursive $(quote "$1") $dir"
}
if [[ -n $MODEL_SRC ]]; then
  copy_to_workers "$MODEL_SRC" "$MODEL_DIR"
fi
if [[ -n $DATA_SRC ]]; then
  copy_to_workers "$DATA_SRC" "$DATA_DIR"
fi
note "next: launch.sh (start the run on every worker)"
