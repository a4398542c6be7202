#!/usr/bin/env bash
# Prints a run's log from the TPU VM workers and follows it.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

WORKER=${RLJAX_TPU_WORKER:-0}
LINES_SHOWN=${RLJAX_TPU_LINES:-100}
FOLLOW=${RLJAX_TPU_FOLLOW:-1}

usage() {
  cat <<EOF2
Usage: $SCRIPT_NAME [settings]

Shows the last LINES lines of LOG_DIR/RUN_NAME.log on WORKER and follows it
(tail -F; Ctrl-C stops following, never the run). Worker 0 prints the
metrics; the others show their own start-up and errors.

$COMMON_HELP
  --worker=W              RLJAX_TPU_WORKER    0 (default), another index, a list 1,3, a range 1-3, or all
  --lines=N               RLJAX_TPU_LINES     lines of history first (default 100)
  --no-follow             RLJAX_TPU_FOLLOW=0  print and return
  --run-name=NAME         RLJAX_TPU_RUN_NAME  (default train)
  --log-dir=DIR           RLJAX_TPU_LOG_DIR   (default rljax-logs)
EOF2
}

while (($#)); do
  case $1 in
    --worker | --worker=*) take_value "$@"; WORKER=$VALUE ;;
    --lines | --lines=*) take_value "$@"; LINES_SHOWN=$VALUE ;;
    --no-follow) FOLLOW=0; SHIFT=1 ;;
    --run-name | --run-name=*) take_value "$@"; RUN_NAME=$VALUE ;;
    --log-dir | --log-dir=*) take_value "$@"; LOG_DIR=$VALUE ;;
    *) common_flag "$@" ;;
  esac
  shift "$SHIFT"
done

require_target
require_run_name
require_worker "$WORKER"
require_remote_path "log dir" "$LOG_DIR" --log-dir RLJAX_TPU_LOG_DIR
[[ $LINES_SHOWN =~ ^[0-9]+$ ]] || die "bad lines '$LINES_SHOWN': a whole number (--lines / RLJAX_TPU_LINES)."
[[ $FOLLOW == 0 || $FOLLOW == 1 ]] || die "bad RLJAX_TPU_FOLLOW '$FOLLOW': 1 (follow) or 0."

tail_args="-n $LINES_SHOWN"
if [[ $FOLLOW == 1 ]]; then
  tail_args+=" -F"
fi
tpu_ssh "$WORKER" "tail $tail_args $(remote_path "$(log_file)")"
