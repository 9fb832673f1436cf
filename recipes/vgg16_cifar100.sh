#!/usr/bin/env bash
# VGG16 (BN) on CIFAR-100, 16 workers, S-SGD / Pipe-SGD / Local-SGD / CoCoD-SGD (conf/experiment/vgg16_cifar100.yaml).
#
# Aims at the paper's figures (Shen et al., IJCAI 2019): 75.74% test accuracy, CoCoD-SGD 2-3x
# faster than S-SGD with 16 GPUs. Hyper-parameters (standard CIFAR practice; the paper's were not
# recoverable): SGD momentum 0.9, weight decay 5e-4 (none on BN/bias), batch 128 per worker
# (global 2048), lr 0.1 per 128 samples scaled linearly (1.6) after a 5-epoch warm-up, cosine to 0
# over 200 epochs, tau 4 (plus a tau 2/8/16 sweep), seeds 0 1 2, time to 70% test accuracy.
# Hardware: 16 GPUs (2 nodes x 8 or 4 nodes x 4), CIFAR-100 in $COCOD_DATA (no download on the nodes).
#
#   recipes/vgg16_cifar100.sh node8                                          # one 8-GPU node, 8 workers
#   NNODES=2 NPROC=8 HEAD=node01 RUN_ID=vgg recipes/vgg16_cifar100.sh torchrun    # on each node
#   NNODES=4 NPROC=4 recipes/vgg16_cifar100.sh slurm                         # submits the sweeps
#   cocod-report outputs --group vgg16_cifar100                              # table + plots
set -euo pipefail
EXPERIMENT=vgg16_cifar100
source "$(dirname "$0")/common.sh"
launch "$@"
