#!/usr/bin/env bash
# Time to accuracy on shaped links: is CoCoD-SGD both as accurate as S-SGD and faster to get there?
#
# Every method trains the same model on the same per-worker links (conf/experiment/mnist1d_tta.yaml:
# MNIST-1D, a 256-channel 1-D CNN of 1.6 MB, 100 Mbit/s per worker, 10 epochs), and validates the
# workers' averaged model after every epoch against the wall clock:
#   S-SGD (Lightning's DDP), and S-SGD with DDP's bf16 gradient hook;
#   Local-SGD at tau 4 and 8 (the report's best of the two is its best period);
#   CoCoD-SGD in fp32, bf16 and int8 rounds, each at the package's default tau="auto" (the
#   shortest period that hides the round, at most tau_max=2) and with the bound lifted
#   (tau_max=64: the period that hides the round, whatever it costs in accuracy);
# at 4 and 8 workers, seeds 0 1 2, each worker count a sweep of its own (S-SGD first in each).
# Then cocod-report writes the table (final accuracy, time to S-SGD's final accuracy less half a
# point, speedup in that time over S-SGD, the periods tau="auto" settled on) and the plot of
# accuracy against wall time.
#
#   sudo recipes/time_to_accuracy.sh [extra overrides...]    (OUT_ROOT=outputs, RUN_ID=<date>)
#   WORKERS=4 SEEDS=0 recipes/time_to_accuracy.sh             # a smaller pass
#
# Root shapes the links (network namespaces); without it every run is unshaped and says so.
# DRY_RUN=1 prints the commands.
source "$(dirname "$0")/shaped_study.sh"
EXPERIMENT=mnist1d_tta
# The study's own group: targets and speedups are over its own S-SGD runs;
# GROUP=<an earlier run's group> adds seeds or rows to it.
GROUP=${GROUP:-tta-$RUN_ID}
COCOD_SWEEPS=(
  "cocod|strategy=cocod strategy.compression=null,bf16,int8 +strategy.tau_max=2,64"
)
shaped_study "$@"
