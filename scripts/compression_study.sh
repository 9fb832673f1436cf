#!/usr/bin/env bash
# The compression study (issue 24): do compressed CoCoD-SGD rounds keep uncompressed CoCoD's
# accuracy? The setting of the README's accuracy study (experiment=mnist1d: MNIST-1D, the 1-D CNN,
# batch 32 per worker, SGD momentum 0.9, lr 0.1 at 4 workers, 2-epoch warm-up, x0.1 at 50% and 75%
# of 20 epochs), 4 workers, seeds 0 1 2, one period for every CoCoD row (tau=2, where uncompressed
# CoCoD matched S-SGD at 4 workers). Rows, every one through the app (cocod-train):
#   CoCoD-SGD fp32, bf16 and int8 (both with error feedback, the default);
#   the raw-snapshot control: int8 encoding the weights themselves rather than the deltas from
#     the last average (scripts/compression_control.py, not a user option);
#   S-SGD with DDP's PowerSGD hook (rank 1, compressed from the second step), and plain S-SGD.
# Then scripts/compression_table.py writes the table from the runs' records (cocod-report would
# put the control in int8's row: its record names the codec, not the control).
#
#   scripts/compression_study.sh [extra overrides...]   (OUT_ROOT=outputs, RUN_ID=<date>)
#   WORKERS=4 SEEDS=0,1,2 TAUS=2 ...                       the defaults; TAUS=2,4 adds tau=4
#   DRY_RUN=1 prints the commands.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RUN_ID=${RUN_ID:-$(date +%Y%m%d-%H%M%S)}
OUT_ROOT=${OUT_ROOT:-outputs}
SEEDS=${SEEDS:-0,1,2}
WORKERS=${WORKERS:-4}
TAUS=${TAUS:-2}
PYTHON=${PYTHON:-python}
GROUP=compression-$RUN_ID
# The control's strategy class is found by module name, in this folder, by the workers too.
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
run() { if [[ "${DRY_RUN:-0}" == 1 ]]; then printf '%q ' "$@"; printf '\n'; else "$@"; fi; }
train=("$PYTHON" -m lightning_cocod.app.train --multirun)
common=(experiment=mnist1d out_root="$OUT_ROOT" group="$GROUP" launcher.devices="$WORKERS" seed="$SEEDS")
started=$SECONDS
run "${train[@]}" "${common[@]}" run_id="$RUN_ID-cocod" "$@" \
  strategy=cocod tau="$TAUS" strategy.compression=null,bf16,int8
run "${train[@]}" "${common[@]}" run_id="$RUN_ID-control" "$@" \
  strategy=cocod strategy._target_=compression_control.CoCoDStrategy tau="$TAUS" strategy.compression=int8
run "${train[@]}" "${common[@]}" run_id="$RUN_ID-ssgd" "$@" \
  strategy=ssgd strategy.comm_hook=null,powersgd
run "$PYTHON" "$HERE/compression_table.py" "$OUT_ROOT/mnist1d" --group "$GROUP" \
  --out "$OUT_ROOT/mnist1d/$RUN_ID-compression.md"
echo "compression study: $((SECONDS - started)) s of wall time"
