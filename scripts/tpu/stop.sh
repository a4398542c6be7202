#!/usr/bin/env bash
# Stops a run on every worker with a signal to the process launch.sh started.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

SIGNAL=${RLJAX_TPU_SIGNAL:-TERM}

usage() {
  cat <<EOF2
Usage: $SCRIPT_NAME [settings]

Sends SIGNAL to the process in LOG_DIR/RUN_NAME.pid on every worker. On
SIGTERM (the default) the trainer saves a checkpoint of the step it is on
and exits; launch.sh with trainer.resume_mode=auto (the default) resumes
from it. SIGKILL stops at once and loses the steps since the last save.

$COMMON_HELP
  --signal=SIG            RLJAX_TPU_SIGNAL    TERM (default), INT or KILL
  --run-name=NAME         RLJAX_TPU_RUN_NAME  (default train)
  --log-dir=DIR           RLJAX_TPU_LOG_DIR   (default rljax-logs)
EOF2
}

while (($#)); do
  case $1 in
    --signal | --signal=*) take_value "$@"; SIGNAL=$VALUE ;;
    --run-name | --run-name=*) take_value "$@"; RUN_NAME=$VALUE ;;
    --log-dir | --log-dir=*) take_value "$@"; LOG_DIR=$VALUE ;;
    *) common_flag "$@" ;;
  esac
  shift "$SHIFT"
done

require_target
require_run_name
require_remote_path "log dir" "$LOG_DIR" --log-dir RLJAX_TPU_LOG_DIR
[[ $SIGNAL =~ ^(TERM|INT|KILL)$ ]] || die "bad signal '$SIGNAL': TERM, INT or KILL (--signal / RLJAX_TPU_SIGNAL)."

tpu_ssh all "kill -s $SIGNAL \"\$(cat $(remote_path "$(pid_file)"))\""
