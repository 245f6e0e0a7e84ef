#!/usr/bin/env bash
# `augtune compare` on a SLURM allocation: a Ray head on the first node, a Ray worker on every other,
# the driver in this batch step (docs: guides/cluster.md). Submit from the repository's folder:
#   sbatch examples/cluster/slurm.sh
#   CONFIG=examples/compare_fashion.yaml NAME=fashion sbatch examples/cluster/slurm.sh
# Submitted again with the same NAME, it resumes the experiment instead (after a timeout or preemption).
# tests/test_docs.py checks this script with `bash -n`.
#SBATCH --job-name=augtune
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=16
#SBATCH --time=02:00:00
#SBATCH --output=augtune-%j.out
# GPUs (untested: nothing in augtune has run on a GPU yet): #SBATCH --gpus-per-task=4, and
# EXTRA="--set resources.use_gpu=true"
set -euo pipefail

CONFIG=${CONFIG:-examples/compare_digits.yaml}
NAME=${NAME:-compare-slurm}
# every node must reach the experiment: a folder every node mounts at the same path, or a bucket
STORAGE=${STORAGE:-$PWD/results}
EXTRA=${EXTRA:-}
PORT=${PORT:-6379}

cd "${SLURM_SUBMIT_DIR:-$PWD}"
# Ray's token authentication, with a token only this job's processes hold (srun passes it on)
export RAY_AUTH_MODE=token
RAY_AUTH_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(32))')
export RAY_AUTH_TOKEN

mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head_node=${nodes[0]}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head_node" hostname --ip-address | awk '{print $1}')
gpus=${SLURM_GPUS_PER_TASK:-0}

started=()
trap 'kill "${started[@]}" 2>/dev/null || true' EXIT
srun --nodes=1 --ntasks=1 -w "$head_node" \
    ray start --head --node-ip-address="$head_ip" --port="$PORT" \
    --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus="$gpus" --block &
started+=($!)
for node in "${nodes[@]:1}"; do
    sleep 5
    srun --nodes=1 --ntasks=1 -w "$node" \
        ray start --address="$head_ip:$PORT" --num-cpus="$SLURM_CPUS_PER_TASK" --num-gpus="$gpus" --block &
    started+=($!)
done

# wait until every node has joined (at most 5 minutes)
export RAY_ADDRESS="$head_ip:$PORT"
for _ in $(seq 60); do
    if python - "${#nodes[@]}" <<'PY'
import sys
import ray
ray.init(address="auto", logging_level="ERROR")
sys.exit(0 if sum(n["Alive"] for n in ray.nodes()) >= int(sys.argv[1]) else 1)
PY
    then break; fi
    sleep 5
done

if [ -e "$STORAGE/$NAME" ]; then
    augtune resume "$STORAGE/$NAME" --address auto
else
    # shellcheck disable=SC2086  # EXTRA holds several words on purpose
    augtune compare "$CONFIG" --address auto --storage "$STORAGE" --name "$NAME" $EXTRA
fi
