# Shared by the time-to-target studies on shaped links (sourced, not run): each recipe sets
# EXPERIMENT, GROUP (after sourcing, from RUN_ID) and COCOD_SWEEPS ("name|overrides" per sweep),
# may replace BASE_SWEEPS (the baselines, run first, in the same form), then calls shaped_study "$@".
# For each worker count, one sweep after another: by default S-SGD and Local-SGD at tau 4 and 8,
# S-SGD with DDP's bf16 gradient hook, then the recipe's sweeps; then cocod-report writes the
# group's table and plots. Every worker sits behind its own link of RATE.
# ROWS=<names> runs only those sweeps (comma-separated, as the arrays name them), e.g. a row added
# to an earlier group with GROUP=. DRY_RUN=1 prints the commands instead of running them (tests
# compose what it prints).
set -euo pipefail
RUN_ID=${RUN_ID:-$(date +%Y%m%d-%H%M%S)}
OUT_ROOT=${OUT_ROOT:-outputs}
SEEDS=${SEEDS:-0,1,2}
WORKERS=${WORKERS:-4 8}
RATE=${RATE:-100mbit}  # per worker, each way
# The checks of every variable above and the commands' runner (DRY_RUN) are common.sh's. This file
# is itself sourced: BASH_SOURCE, not $0, is where it lies.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

BASE_SWEEPS=(
  "base|strategy=ssgd,local_sgd tau=4,8"
  "hook|strategy=ssgd strategy.comm_hook=bf16"
)

shaped_study() {
  local workers sweep overrides common counts names row
  IFS=', ' read -r -a counts <<<"$WORKERS"  # split, never glob-expanded (check_env: counts only)
  names=","
  for sweep in "${BASE_SWEEPS[@]}" "${COCOD_SWEEPS[@]}"; do names+="${sweep%%|*},"; done
  if [[ -n "${ROWS:-}" ]]; then
    [[ "$ROWS" =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] || refuse ROWS "sweep names of this recipe, comma-separated: ${names:1:-1}"
    for row in ${ROWS//,/ }; do
      [[ "$names" == *",$row,"* ]] || refuse ROWS "sweep names of this recipe, comma-separated: ${names:1:-1}"
    done
  fi
  for workers in "${counts[@]}"; do
    common=(experiment="$EXPERIMENT" launcher.rate="$RATE" launcher.topology=pernode out_root="$OUT_ROOT"
      group="$GROUP" launcher.devices="$workers" seed="$SEEDS")
    for sweep in "${BASE_SWEEPS[@]}" "${COCOD_SWEEPS[@]}"; do
      [[ -z "${ROWS:-}" || ",$ROWS," == *",${sweep%%|*},"* ]] || continue
      read -r -a overrides <<<"${sweep#*|}"
      run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-w$workers-${sweep%%|*}" "$@" "${overrides[@]}"
    done
  done
  run cocod-report "$OUT_ROOT/$EXPERIMENT" --group "$GROUP" --out "$OUT_ROOT/$EXPERIMENT/$RUN_ID-report"
}
