#!/usr/bin/env bash
# The long-rounds study with every method at the learning rates tuned for it on seed 0.
#
# The GPT and links of recipes/long_rounds_study.sh (experiment=gpt: AdamW, 4 epochs, 4 workers of
# batch 32, each behind 25 Mbit/s each way), in a group of its own: run names do not carry the
# learning rate or the length of the run, and the report would pool runs that differ only there.
# Rows, both trained for 6 epochs at 4 workers (equal samples):
#   S-SGD at lr 3e-3 (the best of 2e-3, 3e-3 and 4e-3 on seed 0);
#   the overlapped outer round at period 16 (outer16): overlap 1, int8 pseudo-gradients, outer
#   Nesterov SGD lr 1.0 / momentum 0.8 warmed up over its first 4 rounds (a quarter, a half,
#   three quarters, then all of it), inner lr 4e-3 (the best of 2e-3 to 6e-3 on seed 0) at 4
#   workers and 2e-3 at 8 (the best of 1.5e-3 to 6e-3 there, each worker taking half the steps).
# Both are given 6 epochs rather than the study's 4: on 4 the outer round ends 0.03 nats above
# S-SGD (seed 0), on 6 within 0.01, and S-SGD gains as much from the longer run (0.04 nats), so
# the target is S-SGD's at the same 6 epochs. At 8 workers the outer round trains 8 epochs against
# S-SGD's 6: its step is under a quarter of S-SGD's there, so the longer run still ends in under a
# third of S-SGD's time, and on 6 it ended 0.0105 nats above S-SGD, just past the 0.01 asked for;
# seeds 0 1 2, S-SGD first. Both checkpoint every 5 minutes of wall time rather than every epoch:
# a local method's checkpoint gathers every worker's AdamW state (its moments are its own), about
# 10 s at 25 Mbit/s, where S-SGD's one optimizer state costs nothing to gather, so a per-epoch
# policy charges the faster method more per minute. docs/accuracy/long-rounds.md has the tuning
# runs and the per-epoch figures.
#
#   sudo recipes/long_rounds_tuned.sh [extra overrides...]   (OUT_ROOT=outputs, RUN_ID=<date>)
#   SEEDS=1,2 GROUP=tuned-<first RUN_ID> recipes/long_rounds_tuned.sh   # seeds added to a group
#   ROWS=ssgd,outer16 recipes/long_rounds_tuned.sh           # some rows only
#   WORKERS=8 RATE=10mbit recipes/long_rounds_tuned.sh       # the 8-worker rows: at 25 Mbit/s
#     S-SGD's step is under 3x the compute of 8 workers on 2 cores; at 10 Mbit/s about 5.5x
#
# Root shapes the links (network namespaces); without it every run is unshaped and says so.
# DRY_RUN=1 prints the commands.
WORKERS=${WORKERS:-4}
RATE=${RATE:-25mbit}
source "$(dirname "$0")/shaped_study.sh"
EXPERIMENT=gpt
GROUP=${GROUP:-tuned-$RUN_ID}
WARMUP="{_target_:torch.optim.lr_scheduler.LinearLR,_partial_:true,start_factor:0.25,total_iters:3}"
OUTER16="strategy=diloco tau=16 strategy.overlap=1 strategy.compression=int8 strategy.outer_optimizer.lr=1.0"
# The rows' settings depend on the worker count, and shaped_study gives every count the same rows.
[[ "$WORKERS" =~ ^[0-9]+$ ]] || refuse WORKERS "one worker count per run of this recipe (4 or 8)"
INNER_LR=4e-3 OUTER_EPOCHS=6
if ((WORKERS >= 8)); then INNER_LR=2e-3 OUTER_EPOCHS=8; fi
OUTER16+=" strategy.outer_optimizer.momentum=0.8 strategy.outer_scheduler=$WARMUP model.lr=$INNER_LR"
CHECKPOINTS="checkpoint.every_n_epochs=0 checkpoint.every_n_minutes=5"
BASE_SWEEPS=(
  "ssgd|strategy=ssgd model.lr=3e-3 max_epochs=6 $CHECKPOINTS"
)
COCOD_SWEEPS=(
  "outer16|$OUTER16 max_epochs=$OUTER_EPOCHS $CHECKPOINTS"
)
shaped_study "$@"
