#!/usr/bin/env bash
# Time to accuracy on MNIST-1D at 8 workers, on a training run long enough to be representative.
#
# The time-to-accuracy study's model, links and schedule (recipes/time_to_accuracy.sh: the
# 256-channel 1-D CNN of 1.6 MB, 100 Mbit/s per worker each way, SGD momentum 0.9, lr 0.2 at 8
# workers, 10 epochs) on five times the signals (conf/experiment/mnist1d_long.yaml: 40,000 for
# training, 156 steps an epoch at 8 workers instead of 31). Rows: S-SGD, then the package's
# recommended configuration, CoCoD-SGD with int8 rounds at tau="auto" (at most 2), then the outer
# round at tau 4 with Local-SGD's merge (outer SGD lr 1, no momentum), its int8 all-reduce
# overlapped with the round's last step; seeds 0 1 2. The target is S-SGD's final validation
# accuracy less half a point.
#
#   sudo recipes/mnist1d_long.sh [extra overrides...]        (OUT_ROOT=outputs, RUN_ID=<date>)
#   SEEDS=0 recipes/mnist1d_long.sh                          # one seed first; then, to add seeds:
#   SEEDS=1,2 GROUP=long1d-<first RUN_ID> recipes/mnist1d_long.sh
#
# Root shapes the links (network namespaces); without it every run is unshaped and says so.
# DRY_RUN=1 prints the commands.
WORKERS=${WORKERS:-8}
source "$(dirname "$0")/shaped_study.sh"
EXPERIMENT=mnist1d_long
# The study's own group: targets and speedups are over its own S-SGD runs;
# GROUP=<an earlier run's group> adds seeds or rows to it.
GROUP=${GROUP:-long1d-$RUN_ID}
BASE_SWEEPS=(
  "ssgd|strategy=ssgd"
)
COCOD_SWEEPS=(
  "cocod|strategy=cocod strategy.compression=int8"
  "overlap|strategy=diloco tau=4 strategy.overlap=1 strategy.compression=int8 strategy.outer_optimizer.lr=1.0 strategy.outer_optimizer.momentum=0 strategy.outer_optimizer.nesterov=false"
)
shaped_study "$@"
