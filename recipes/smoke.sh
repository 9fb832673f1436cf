#!/usr/bin/env bash
# The recipe machinery on a 2-core CPU in about two minutes: scikit-learn's digits, a narrow
# SmallCNN, 2 worker processes per job, all four methods, then the report: every job runs, learns
# (test accuracy well above chance) and the report reads them.
#   recipes/smoke.sh [extra overrides...]        (OUT_ROOT=outputs, RUN_ID=<date> by default)
set -euo pipefail
RUN_ID=${RUN_ID:-$(date +%Y%m%d-%H%M%S)}
OUT_ROOT=${OUT_ROOT:-outputs}
source "$(dirname "$0")/common.sh"  # checks RUN_ID, OUT_ROOT and DRY_RUN; run()
run cocod-train --multirun experiment=smoke run_id="$RUN_ID" out_root="$OUT_ROOT" "$@" strategy=ssgd,pipe_sgd,local_sgd,cocod
run cocod-report "$OUT_ROOT/smoke/$RUN_ID"
