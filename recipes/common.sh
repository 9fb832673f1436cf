# Shared by the recipe scripts (sourced, not run). Every recipe sets its own defaults, then sources
# this file, which checks the environment variables (check_env) before anything runs; the paper
# recipes (resnet18_cifar10.sh, vgg16_cifar100.sh) then set EXPERIMENT and call launch.
#
# Every variable a recipe reads is checked here, in one place, and a bad one is refused by name in
# one line (exit 2) before any command runs: a word where a number goes was a study run for real
# (DRY_RUN=true ran it, only the exact 1 printed), a '*' was expanded to the folder's file names,
# a blank WORKERS ran no sweep and exited 0. Unset and empty are the same: the default.
# Accepted (recipes/README.md says the same):
#   DRY_RUN, HETERO   0 or 1
#   SEEDS             whole numbers from 0 to 4294967295, comma-separated: 0,1,2
#   TAUS              periods from 1 to 99999 or auto, comma-separated: 2,8,16
#   WORKERS           counts from 1 to 99999, separated by commas or single spaces: 4,8 or "4 8"
#   NNODES, NPROC     a count from 1 to 99999;  MAX_RESTARTS  a count from 0 to 99999
#   RATE              a tc rate: a number and kbit, mbit or gbit: 100mbit
#   SLOWDOWN          a list of positive factors: [1,1,2,2]
#   RUN_ID, GROUP     letters, digits and _ . + - (at most 100, not starting with . + -)
#   OUT_ROOT          a path of letters, digits and _ . / + - (not starting with -)
#   HEAD              a host name or address: letters, digits, . and -

refuse() {  # refuse NAME ACCEPTED: the one line, then exit before anything ran
  printf '%s: %s=%q is invalid; accepted: %s\n' "${0##*/}" "$1" "${!1}" "$2" >&2
  exit 2
}

check_env() {
  local count='[1-9][0-9]{0,4}' seed='(0|[1-9][0-9]{0,9})' factor='([0-9]+(\.[0-9]*)?|\.[0-9]+)' f
  local name
  for name in DRY_RUN HETERO; do
    [[ -z "${!name:-}" || "${!name}" == 0 || "${!name}" == 1 ]] || refuse "$name" "0 or 1"
  done
  if [[ -n "${SEEDS:-}" ]]; then
    [[ "$SEEDS" =~ ^$seed(,$seed)*$ ]] || refuse SEEDS "whole numbers from 0 to 4294967295, comma-separated (0,1,2)"
    for f in ${SEEDS//,/ }; do  # digits and commas only by now: nothing to expand
      ((f <= 4294967295)) || refuse SEEDS "whole numbers from 0 to 4294967295, comma-separated (0,1,2)"
    done
  fi
  [[ -z "${TAUS:-}" || "$TAUS" =~ ^($count|auto)(,($count|auto))*$ ]] ||
    refuse TAUS "periods from 1 to 99999 or auto, comma-separated (2,8,16)"
  [[ -z "${WORKERS:-}" || "$WORKERS" =~ ^$count([, ]$count)*$ ]] ||
    refuse WORKERS "worker counts from 1 to 99999, separated by commas or single spaces (4,8)"
  for name in NNODES NPROC; do
    [[ -z "${!name:-}" || "${!name}" =~ ^$count$ ]] || refuse "$name" "a count from 1 to 99999"
  done
  [[ -z "${MAX_RESTARTS:-}" || "$MAX_RESTARTS" =~ ^(0|$count)$ ]] || refuse MAX_RESTARTS "a count from 0 to 99999"
  [[ -z "${RATE:-}" || "$RATE" =~ ^$factor(kbit|mbit|gbit)$ ]] ||
    refuse RATE "a tc rate: a number and kbit, mbit or gbit (100mbit)"
  if [[ -n "${SLOWDOWN:-}" ]]; then
    [[ "$SLOWDOWN" =~ ^\[$factor(,$factor)*\]$ ]] || refuse SLOWDOWN "a list of positive factors ([1,1,2,2])"
    for f in ${SLOWDOWN//[\[\],]/ }; do
      [[ ! "$f" =~ ^[0.]+$ ]] || refuse SLOWDOWN "a list of positive factors ([1,1,2,2])"
    done
  fi
  for name in RUN_ID GROUP; do
    [[ -z "${!name:-}" || "${!name}" =~ ^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,99}$ ]] ||
      refuse "$name" "letters, digits and _ . + -, at most 100, not starting with . + -"
  done
  [[ -z "${OUT_ROOT:-}" || "$OUT_ROOT" =~ ^[A-Za-z0-9_./+][A-Za-z0-9_./+-]*$ ]] ||
    refuse OUT_ROOT "a path of letters, digits and _ . / + -, not starting with -"
  [[ -z "${HEAD:-}" || "$HEAD" =~ ^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?$ ]] ||
    refuse HEAD "a host name or address: letters, digits, . and -"
}
check_env

# Two sweeps per recipe, each a Hydra multirun whose jobs run one after another:
#   methods: S-SGD, Pipe-SGD, Local-SGD and CoCoD-SGD at their configured tau (4), seeds 0 1 2;
#   tau:     Local-SGD and CoCoD-SGD at tau 2, 8, 16, seed 0 (speedup against tau, over the
#            methods sweep's S-SGD run of seed 0: same group, same condition, same seed).
# A sweep's folder is outputs/$EXPERIMENT/$RUN_ID-<sweep>; all runs share the wandb group
# $EXPERIMENT, and each run finds its S-SGD run among the group's run.json records, so speedups are
# computed across sweeps.
#
# Hydra's parser wants --multirun before the overrides.
# DRY_RUN=1 prints the commands instead of running them (tests compose what it prints).

SEEDS=${SEEDS:-0,1,2}
TAUS=${TAUS:-2,8,16}
RUN_ID=${RUN_ID:-$(date +%Y%m%d-%H%M%S)}
SWEEPS=(
  "methods|strategy=ssgd,pipe_sgd,local_sgd,cocod seed=$SEEDS"
  "tau|strategy=local_sgd,cocod tau=$TAUS seed=0"
)
# HETERO=1: the heterogeneous-cluster runs instead. Each worker's batch follows its measured
# speed (proportional sampling, averages weighted by batch share) for Local-SGD and CoCoD-SGD,
# against S-SGD and CoCoD-SGD without it; CoCoD also with tau=auto. On a homogeneous cluster,
# SLOWDOWN='[1,1,2,2,...]' (one factor per worker) simulates the mix.
if [[ "${HETERO:-0}" == 1 ]]; then
  slow=${SLOWDOWN:+hetero.slowdown=$SLOWDOWN}
  SWEEPS=(
    "hetero-base|strategy=ssgd,cocod seed=$SEEDS $slow"
    "hetero-ps|strategy=local_sgd,cocod hetero.proportional=true seed=$SEEDS $slow"
    "hetero-auto|strategy=cocod tau=auto hetero.proportional=true seed=$SEEDS $slow"
  )
fi

run() {  # DRY_RUN is 0 or 1 by now (check_env)
  if [[ "${DRY_RUN:-0}" == 1 ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

usage() {
  cat >&2 <<USAGE
usage: $0 MODE [extra overrides...]
  node8      one node, 8 GPUs: 8 workers (global batch 1024), the single-node variant
  node16     one node, 16 GPUs: 16 workers
  torchrun   16 workers over NNODES x NPROC (2x8 or 4x4); run this on every node with
             NNODES, NPROC, HEAD (rendezvous host) and the same RUN_ID set
  slurm      16 workers: submits sbatch jobs of NNODES x NPROC tasks (2x8 default, or 4x4)
USAGE
  exit 2
}

# launch MODE [overrides...]: every sweep of the recipe in the chosen mode.
launch() {
  local mode=${1:-}
  shift || true
  local nnodes=${NNODES:-2} nproc=${NPROC:-8} sweep name overrides
  for sweep in "${SWEEPS[@]}"; do
    name=${sweep%%|*}
    read -r -a overrides <<<"${sweep#*|}"
    case "$mode" in
      node8 | node16)
        run cocod-train --multirun experiment="$EXPERIMENT" launcher=gpu launcher.devices="${mode#node}" \
          run_id="$RUN_ID-$name" "$@" "${overrides[@]}" ;;
      torchrun)
        # Every rank composes the same config and runs the same jobs in the same order; run_id
        # pins the folders (a clock could differ between nodes). After a failure torchrun starts
        # every worker again (MAX_RESTARTS times) and checkpoint.resume=auto continues each job
        # from its checkpoint; restarts need the rendezvous store not shared with the agent.
        run env TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes="$nnodes" --nproc-per-node="$nproc" \
          --max-restarts="${MAX_RESTARTS:-3}" --rdzv-backend=c10d \
          --rdzv-endpoint="${HEAD:?set HEAD to the rendezvous host}:29500" --rdzv-id="$RUN_ID-$name" \
          -m lightning_cocod.app.train --multirun experiment="$EXPERIMENT" launcher=torchrun \
          run_id="$RUN_ID-$name" checkpoint.resume=auto "$@" "${overrides[@]}" ;;
      slurm)
        # run_id defaults to SLURM_JOB_ID inside the job: the same on every task.
        run sbatch --nodes="$nnodes" --ntasks-per-node="$nproc" --gpus-per-node="$nproc" \
          --job-name="$EXPERIMENT-$name" "$(dirname "${BASH_SOURCE[0]}")/slurm.sbatch" \
          --multirun experiment="$EXPERIMENT" "$@" "${overrides[@]}" ;;
      *) usage ;;
    esac
  done
}
