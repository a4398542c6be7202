# shellcheck shell=bash disable=SC2034
# Shared by the scripts in scripts/tpu/: settings, their validation, shell
# quoting, and `run`, which prints a command (--dry-run) or prints and runs it.
#
# Every setting comes from a flag or from an environment variable; a flag wins.
# Remote paths (on the TPU VM workers) are relative to the worker's home
# directory unless they start with /.
# (SC2034 is off in this file: the scripts that source it read its settings.)

set -euo pipefail

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  printf '%s: error: needs bash 4.4 or newer, this is %s (on macOS: brew install bash).\n' \
    "$(basename "$0")" "$BASH_VERSION" >&2
  exit 2
fi

SCRIPT_NAME=$(basename "$0")

PROJECT=${RLJAX_TPU_PROJECT:-}
ZONE=${RLJAX_TPU_ZONE:-}
NAME=${RLJAX_TPU_NAME:-}
ACCELERATOR_TYPE=${RLJAX_TPU_TYPE:-}
RUNTIME_VERSION=${RLJAX_TPU_VERSION:-}
QUEUED=${RLJAX_TPU_QUEUED:-0}
QR_ID=${RLJAX_TPU_QR_ID:-}
REMOTE_DIR=${RLJAX_TPU_REMOTE_DIR:-rljax}
VENV=${RLJAX_TPU_VENV:-rljax-venv}
LOG_DIR=${RLJAX_TPU_LOG_DIR:-rljax-logs}
RUN_NAME=${RLJAX_TPU_RUN_NAME:-train}
DRY_RUN=${RLJAX_TPU_DRY_RUN:-0}

COMMON_HELP="Settings shared by the scripts (flag, or environment variable):
  --project=ID            RLJAX_TPU_PROJECT   GCP project id
  --zone=ZONE             RLJAX_TPU_ZONE      e.g. us-east5-b, europe-west4-a
  --name=NAME             RLJAX_TPU_NAME      TPU VM (node) name
  --dry-run               RLJAX_TPU_DRY_RUN=1 print every command, one a line, run nothing
  -h, --help              this help"

# die MESSAGE: the error on stderr, exit status 2.
die() {
  printf '%s: error: %s\n' "$SCRIPT_NAME" "$1" >&2
  exit 2
}

# note MESSAGE: progress on stderr; --dry-run prints commands only.
note() {
  if [[ $DRY_RUN != 1 ]]; then
    printf '%s: %s\n' "$SCRIPT_NAME" "$1" >&2
  fi
}

# quote WORD: WORD as one shell word; plain words stay bare, and in
# --flag=VALUE only VALUE is quoted.
quote() {
  local word=$1
  if [[ $word =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
    printf '%s' "$word"
  elif [[ $word =~ ^(--[A-Za-z0-9.-]+=)(.+)$ ]]; then
    printf '%s' "${BASH_REMATCH[1]}"
    quote "${BASH_REMATCH[2]}"
  else
    printf "'%s'" "${word//\'/\'\\\'\'}"
  fi
}

# quote_all WORD...: the words quoted and joined by spaces.
quote_all() {
  local out=() word
  for word in "$@"; do
    out+=("$(quote "$word")")
  done
  printf '%s' "${out[*]}"
}

# remote_path PATH: PATH as a word for the worker's shell ("$HOME"/PATH if relative).
remote_path() {
  if [[ $1 == /* ]]; then
    quote "$1"
  else
    # shellcheck disable=SC2016  # the worker's shell expands $HOME
    printf '"$HOME"/%s' "$(quote "$1")"
  fi
}

# run COMMAND...: prints COMMAND (shell-quoted); runs it unless --dry-run.
run() {
  if [[ $DRY_RUN == 1 ]]; then
    printf '%s\n' "$(quote_all "$@")"
  else
    printf '+ %s\n' "$(quote_all "$@")" >&2
    "$@"
  fi
}

# tpu_ssh WORKER COMMAND: runs the shell COMMAND on the TPU VM's WORKER(s).
tpu_ssh() {
  run gcloud compute tpus tpu-vm ssh "$NAME" --project="$PROJECT" --zone="$ZONE" \
    --worker="$1" --command="$2"
}

# take_value ARGS...: the value of "--flag=VALUE" or "--flag VALUE" in VALUE,
# and in SHIFT how many arguments it used.
take_value() {
  case $1 in
    --*=*) VALUE=${1#*=}; SHIFT=1 ;;
    *)
      (($# >= 2)) || die "$1 needs a value (see --help)"
      VALUE=$2
      SHIFT=2
      ;;
  esac
}

# common_flag ARGS...: parses one flag every script takes; SHIFT says how
# many arguments it used.
common_flag() {
  case $1 in
    --project | --project=*) take_value "$@"; PROJECT=$VALUE ;;
    --zone | --zone=*) take_value "$@"; ZONE=$VALUE ;;
    --name | --name=*) take_value "$@"; NAME=$VALUE ;;
    --dry-run) DRY_RUN=1; SHIFT=1 ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
}

# missing SETTING FLAG ENV EXAMPLE: the error for a setting nobody gave.
missing() {
  die "missing setting: $1. Pass $2=$4 or export $3=$4."
}

require_project() {
  [[ -n $PROJECT ]] || missing "project (the GCP project id)" --project RLJAX_TPU_PROJECT my-project
  [[ $PROJECT =~ ^([a-z][-a-z0-9.]*:)?[a-z][-a-z0-9]{4,28}[a-z0-9]$ ]] \
    || die "bad project '$PROJECT': a project id is 6-30 lowercase letters, digits or hyphens, starting with a letter (--project / RLJAX_TPU_PROJECT)."
}

require_zone() {
  [[ -n $ZONE ]] || missing "zone" --zone RLJAX_TPU_ZONE us-east5-b
  [[ $ZONE =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] \
    || die "bad zone '$ZONE': expected REGION-ZONE such as us-east5-b or europe-west4-a (--zone / RLJAX_TPU_ZONE)."
}

require_name() {
  [[ -n $NAME ]] || missing "name (the TPU VM name)" --name RLJAX_TPU_NAME rljax-v6e-8
  [[ $NAME =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] \
    || die "bad name '$NAME': lowercase letters, digits and hyphens, starting with a letter, at most 63 (--name / RLJAX_TPU_NAME)."
}

require_accelerator_type() {
  [[ -n $ACCELERATOR_TYPE ]] || missing "accelerator type" --accelerator-type RLJAX_TPU_TYPE v6e-8
  check_accelerator_type
}

check_accelerator_type() {
  [[ $ACCELERATOR_TYPE =~ ^(v2|v3|v4|v5p|v5litepod|v6e)-[1-9][0-9]*$ ]] \
    || die "bad accelerator type '$ACCELERATOR_TYPE': expected FAMILY-SIZE with FAMILY one of v2, v3, v4, v5p, v5litepod (v5e), v6e, e.g. v6e-8, v5litepod-16, v4-32 (--accelerator-type / RLJAX_TPU_TYPE)."
}

# default_runtime_version TYPE: the TPU software version Google lists for TYPE's family.
default_runtime_version() {
  case $1 in
    v6e-*) printf 'v2-alpha-tpuv6e' ;;
    v5litepod-*) printf 'v2-alpha-tpuv5-lite' ;;
    v5p-*) printf 'v2-alpha-tpuv5' ;;
    *) printf 'tpu-ubuntu2204-base' ;;
  esac
}

require_runtime_version() {
  RUNTIME_VERSION=${RUNTIME_VERSION:-$(default_runtime_version "$ACCELERATOR_TYPE")}
  [[ $RUNTIME_VERSION =~ ^[a-z0-9][-a-z0-9.]*$ ]] \
    || die "bad runtime version '$RUNTIME_VERSION': e.g. v2-alpha-tpuv6e, v2-alpha-tpuv5-lite, tpu-ubuntu2204-base (--version / RLJAX_TPU_VERSION)."
}

# hosts TYPE: how many TPU VM workers a slice of TYPE has.
hosts() {
  local family=${1%-*} size=${1##*-}
  case $family in
    v5litepod | v6e) if ((size <= 8)); then echo 1; else echo $((size / 4)); fi ;;
    *) if ((size <= 8)); then echo 1; else echo $((size / 8)); fi ;;
  esac
}

# check_gcs_uri SETTING VALUE FLAG ENV: VALUE must be gs://BUCKET[/PATH].
check_gcs_uri() {
  [[ $2 =~ ^gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/.*)?$ ]] \
    || die "bad $1 '$2': must be gs://BUCKET[/PATH], the bucket name 3-63 lowercase letters, digits, '-', '_' or '.', e.g. gs://my-bucket/rljax ($3 / $4)."
}

require_queued_id() {
  [[ $QUEUED == 0 || $QUEUED == 1 ]] || die "bad RLJAX_TPU_QUEUED '$QUEUED': 1 (queued resource) or 0."
  QR_ID=${QR_ID:-$NAME-qr}
  [[ $QR_ID =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] \
    || die "bad queued resource id '$QR_ID': lowercase letters, digits and hyphens, starting with a letter (--qr-id / RLJAX_TPU_QR_ID)."
}

require_dry_run_flag() {
  [[ $DRY_RUN == 0 || $DRY_RUN == 1 ]] || die "bad RLJAX_TPU_DRY_RUN '$DRY_RUN': 1 (print only) or 0."
}

require_run_name() {
  [[ $RUN_NAME =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] \
    || die "bad run name '$RUN_NAME': letters, digits, '.', '_' and '-' (--run-name / RLJAX_TPU_RUN_NAME)."
}

# require_remote_path SETTING VALUE FLAG ENV: a non-empty path on the workers.
require_remote_path() {
  [[ -n $2 && $2 != *$'\n'* ]] || die "bad $1 '$2': give a path on the workers ($3 / $4)."
}

# require_worker W: a worker index, list (1,3), range (1-3) or all.
require_worker() {
  [[ $1 == all || $1 =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] \
    || die "bad worker '$1': an index such as 0, a list 1,3, a range 1-3, or all (--worker / RLJAX_TPU_WORKER)."
}

# require_target: project, zone and name of an existing TPU VM.
require_target() {
  require_dry_run_flag
  require_project
  require_zone
  require_name
}

log_file() {
  printf '%s/%s.log' "${LOG_DIR%/}" "$RUN_NAME"
}

pid_file() {
  printf '%s/%s.pid' "${LOG_DIR%/}" "$RUN_NAME"
}
