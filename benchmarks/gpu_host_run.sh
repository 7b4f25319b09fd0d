#!/usr/bin/env bash
# Every measurement that only a lent GPU host (one GPU, 16 quiet cores) can give, in one bounded run:
#   1. a whole training step of three small transformers on the card (bench_device_step.py --measure),
#   2. the experts' batched GEMMs of an MoE layer (bench_expert_gemms.py --measure),
#   3. the 4-rank real-run validation on the host's CPUs (bench_validate.py --cases 4-rank),
#   4. the 10,080-point sweep's scaling over worker counts (bench_sweep.py --scaling), when asked.
# Each part has its own time limit, so one that hangs costs only its share; what each wrote is kept.
# The predictions are made afterwards on any machine from the files written here (see RESULTS.md).
#
#   bash benchmarks/gpu_host_run.sh OUT_DIR [SCALING_COUNTS [TREE]]   # e.g. OUT_DIR 2,14,4; at most 9 minutes
# TREE: the source tree whose sweep is measured (default this one).
set -u
out=$(realpath -m "${1:?usage: gpu_host_run.sh OUT_DIR [SCALING_COUNTS [TREE]]}")
counts=${2:-}
tree=$(realpath "${3:-.}")
py=${PYTHON:-python3}
mkdir -p "$out" /tmp/gpu-host-logs
logs=/tmp/gpu-host-logs
stamp() { echo "[$(date -u +%T)] $*"; }

stamp "machine: $(nproc) cores; $(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1)"
nvidia-smi > "$logs/nvidia-smi.txt" 2>&1

stamp "1/4 training steps on the card"
timeout 110 "$py" benchmarks/bench_device_step.py --measure --out "$out/step-hot.json" --seconds 12 \
    > "$logs/step.log" 2>&1; stamp "  exit $?"; tail -4 "$logs/step.log"

stamp "2/4 the experts' GEMMs"
timeout 70 "$py" benchmarks/bench_expert_gemms.py --measure --out "$out/experts.json" \
    > "$logs/experts.log" 2>&1; stamp "  exit $?"; tail -2 "$logs/experts.log"

stamp "3/4 4-rank validation on the host's CPUs"
timeout 175 "$py" benchmarks/bench_validate.py --cases 4-rank --runs 3 --time-limit 150 --no-write \
    --out "$logs/validate" > "$logs/validate.log" 2>&1; stamp "  exit $?"; tail -6 "$logs/validate.log"

if [ -n "$counts" ]; then
    stamp "4/4 sweep scaling on workers $counts"
    (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" timeout 160 "$py" benchmarks/bench_sweep.py \
        --scaling "$counts" --repeats 1 --budget 140 --no-write --out "$out/scaling.md") > "$logs/scaling.log" 2>&1
    stamp "  exit $?"; tail -12 "$logs/scaling.log"
fi

tar czf "$out/logs.tgz" -C /tmp gpu-host-logs
stamp "done"
