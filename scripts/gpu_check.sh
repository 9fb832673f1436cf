#!/usr/bin/env bash
# Every GPU check in one command, for a machine with a CUDA device (about 5 minutes on one H200;
# each stage capped, the whole under 9 minutes, so one 10-minute device call always finishes it):
#   1. the GPU tests (tests/gpu: stream order, what the CUDA figures measure, device data, the
#      outer round (theta and a Nesterov outer step at overlap 0, 1 and the whole period) against
#      the same computation on the CPU, a 2-rank Trainer on one GPU against the reference rules
#      (DiLoCo's among them), and over NCCL with a GPU per rank where there are two); the stage's
#      cap exceeds each test's own timeout, so a test that overruns fails alone and the others
#      still report; the summary counts the outer round's tests apart;
#   2. the product's training step against a bare PyTorch loop (ResNet18, batch 128), the host
#      syncs left in a product step, and the model's all-reduce alone on 2 ranks;
#   3. the benchmark on 2 ranks sharing the GPU: S-SGD, CoCoD (tau=4, and auto up to 64) and DiLoCo
#      (tau=4: its outer step's cost at round ends) against the bound, 100 steps of which 30 are warm-up.
# Runs from the repository without installing it: needs torch, pytorch-lightning, torchmetrics,
# pytest, pytest-timeout, scikit-learn and matplotlib; not hydra-core, not wandb, no network.
#
#   bash scripts/gpu_check.sh [OUT_DIR]     (default: runs/gpu-check-<time>)
#
# OUT_DIR receives 7 files: summary.md (read this first), tests.log, steptime.log, steptime.json,
# bench.log, environment.txt and details.tar.gz (everything else: junit XML, every benchmark
# run's per-rank step times and logs). The working folder is GPU_CHECK_WORK (default: a temporary one).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
out="${1:-runs/gpu-check-$(date +%Y%m%d-%H%M%S)}"
work="${GPU_CHECK_WORK:-$(mktemp -d -t gpu-check.XXXXXX)}"
mkdir -p "$out" "$work"
started=$SECONDS

stage() {  # stage NAME SECONDS COMMAND...: run capped, log to OUT_DIR/NAME.log, never stop the check
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s): $*"
    timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$out/$name.log" 2>&1
    local code=$?
    echo "   exit $code after $((SECONDS - started)) s in all"
    tail -n 4 "$out/$name.log" | sed 's/^/   | /'
}

{
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
    python - <<'EOF'
import sys, torch, pytorch_lightning as pl
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda,
      "| lightning", pl.__version__, "| GPUs:", torch.cuda.device_count(), gpu)
EOF
} >"$work/environment.txt" 2>&1
cp "$work/environment.txt" "$out/"
cat "$out/environment.txt"

stage tests 280 python -m pytest -q -rs -p no:cacheprovider tests/gpu tests/core/test_comm_cuda_timing.py \
    --junitxml="$work/tests.xml"
stage steptime 75 python -m lightning_cocod.tools.steptime --model resnet18 --batch-size 128 --steps 60 --warmup 10 \
    --accelerator gpu --sync-report --allreduce 2 --json "$work/steptime.json"
stage bench 180 python -m lightning_cocod.tools.bench --accelerator gpu --workers 2 --model resnet18 --batch-size 128 \
    --rates none --methods ssgd,cocod:4,cocod:auto,diloco:4 --tau-max 64 --steps 100 --warmup 30 --no-overhead --out "$work/bench"

[ -f "$work/steptime.json" ] && cp "$work/steptime.json" "$out/"
python scripts/gpu_summary.py "$work" >"$out/summary.md" 2>>"$out/bench.log"
tar -czf "$out/details.tar.gz" -C "$work" . 2>/dev/null
echo "== done in $((SECONDS - started)) s; summary: $out/summary.md"
cat "$out/summary.md"
