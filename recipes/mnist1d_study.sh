#!/usr/bin/env bash
# The accuracy study: does CoCoD-SGD reach S-SGD's accuracy, and what does a longer period cost?
#
# MNIST-1D (8,000 training signals, generated, no download), the paper's 1-D CNN (8 k parameters),
# CPU workers of batch 32, SGD momentum 0.9, weight decay 1e-4, learning rate 0.025 per 32 samples
# scaled with the global batch (0.1 at 4 workers, 0.2 at 8), 2-epoch linear warm-up, x0.1 at 50%
# and 75% of 20 epochs: the same schedule for every method (conf/experiment/mnist1d.yaml). Each job
# runs its workers on this machine over the loopback (gloo), one job after another:
#   methods: S-SGD, Pipe-SGD, Local-SGD and CoCoD-SGD at tau 1, 2, 4 and 16, at 4 and 8 workers,
#            seeds 0 1 2 (S-SGD and Pipe-SGD once per worker count and seed: they have no period);
#   auto:    CoCoD-SGD with tau=auto (its default bounds);
#   half:    CoCoD-SGD keeping half of each round's progress (strategy.progress=0.5) at tau 4.
# Then cocod-report writes the table (test accuracy mean ± std over seeds, steady step time,
# speedup vs S-SGD) and the plots (accuracy against wall time; final accuracy against tau).
#
#   recipes/mnist1d_study.sh [extra overrides...]     (OUT_ROOT=outputs, RUN_ID=<date>)
#   WORKERS=4 SEEDS=0 TAUS=4 recipes/mnist1d_study.sh  # a quicker, smaller pass
#
# Time on the 2-core machine this was developed on: see docs/accuracy/index.md (most of a
# job's time is starting its workers, which import Lightning). DRY_RUN=1 prints the commands.
set -euo pipefail
RUN_ID=${RUN_ID:-$(date +%Y%m%d-%H%M%S)}
OUT_ROOT=${OUT_ROOT:-outputs}
SEEDS=${SEEDS:-0,1,2}
WORKERS=${WORKERS:-4,8}
TAUS=${TAUS:-1,2,4,16}
# The study's own group: its speedups are over its own S-SGD runs;
# GROUP=<an earlier run's group> adds seeds or rows to it.
GROUP=${GROUP:-mnist1d-$RUN_ID}
source "$(dirname "$0")/common.sh"  # checks every variable above (and DRY_RUN); run()
common=(experiment=mnist1d out_root="$OUT_ROOT" group="$GROUP" launcher.devices="${WORKERS// /,}" seed="$SEEDS")
run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-methods" "$@" \
  strategy=ssgd,pipe_sgd,local_sgd,cocod tau="$TAUS"
run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-auto" "$@" strategy=cocod tau=auto
run cocod-train --multirun "${common[@]}" run_id="$RUN_ID-half" "$@" strategy=cocod tau=4 strategy.progress=0.5
run cocod-report "$OUT_ROOT/mnist1d" --group "$GROUP" --out "$OUT_ROOT/mnist1d/$RUN_ID-report"
