#!/usr/bin/env bash
# Every measurement that only a lent GPU host (one GPU, 16 quiet cores) can give, in one bounded run:
#   1. whole training steps on the card (bench_device_step.py --measure): three small transformers
#      briefly, then the Megatron-Core hold-out's 1.7B GPT run hot for a while, nvidia-smi's clocks
#      and power sampled beside them;
#   2. the GPU path of the harness (bench_gpu.py: CUDA-event layer profiles against a stage's step);
#   3. the 4-rank transformer validation on the host's CPUs (bench_validate.py --cases 4, the default
#      calibration: one per partition and round);
#   4. the host's own slowdown with N busy processes (host_contention.py), which the sweep's scaling
#      on many workers cannot beat;
#   5. the 10,080-point sweep's scaling over worker counts (bench_sweep.py --scaling), when asked.
# Each part has its own time limit, so one that hangs costs only its share; what each wrote is kept.
# The predictions are made afterwards on any machine from the files written here (see RESULTS.md).
#
#   bash benchmarks/gpu_host_run.sh OUT_DIR [SCALING_COUNTS [TREE]]   # under 8 minutes, 10.5 with scaling
# TREE: the source tree whose sweep is measured (default this one).
set -u
out=$(realpath -m "${1:?usage: gpu_host_run.sh OUT_DIR [SCALING_COUNTS [TREE]]}")
counts=${2:-}
tree=$(realpath "${3:-.}")
py=${PYTHON:-python3}
logs=/tmp/gpu-host-logs
mkdir -p "$out" "$logs"
stamp() { echo "[$(date -u +%T)] $*"; }

stamp "machine: $(nproc) cores; $(nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader 2>&1)"
{ lscpu; nvidia-smi; cat /proc/loadavg; } > "$logs/machine.txt" 2>&1
grep -E "^(Model name|Thread|Core|Socket|NUMA node\(s\)|CPU\(s\))" "$logs/machine.txt"

stamp "1/5 training steps on the card"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 500 \
    > "$logs/smi.csv" 2>&1 & smi=$!
timeout 45 "$py" benchmarks/bench_device_step.py --measure --models 4x --out "$out/step-small.json" --seconds 6 \
    > "$logs/step.log" 2>&1; stamp "  exit $?"
timeout 70 "$py" benchmarks/bench_device_step.py --measure --models 1.7b --out "$out/step-1.7b.json" --seconds 40 \
    >> "$logs/step.log" 2>&1; stamp "  exit $?"; grep -v Warn "$logs/step.log" | grep "ms" | cut -c1-200
kill $smi 2>/dev/null

stamp "2/5 the harness's GPU path"
timeout 45 "$py" benchmarks/bench_gpu.py --out "$out/bench-gpu.md" > "$logs/gpu.log" 2>&1; stamp "  exit $?"
tail -5 "$logs/gpu.log"

stamp "3/5 4-rank transformer validation on the host's CPUs"
timeout 220 "$py" benchmarks/bench_validate.py --cases 4 --runs 3 --time-limit 200 --no-write \
    --out "$logs/validate" > "$logs/validate.log" 2>&1; stamp "  exit $?"
grep -E "^\| (gpipe|1f1b|pipedream|2bw|pipemare|interleaved|zb)" "$logs/validate.log" | head -8

stamp "4/5 the host's slowdown with N busy processes"
timeout 60 "$py" benchmarks/host_contention.py --counts 1,2,8,14,16 --every 40 --out "$out/contention.json" \
    > "$logs/contention.log" 2>&1; stamp "  exit $?"; cat "$logs/contention.log"

if [ -n "$counts" ]; then
    stamp "5/5 sweep scaling on workers $counts"
    (cd "$tree" && PYTHONPATH="$tree${PYTHONPATH:+:$PYTHONPATH}" timeout 160 "$py" benchmarks/bench_sweep.py \
        --scaling "$counts" --repeats 1 --budget 140 --no-write --out "$out/scaling.md") > "$logs/scaling.log" 2>&1
    stamp "  exit $?"; tail -12 "$logs/scaling.log"
fi

tar czf "$out/logs.tgz" -C /tmp gpu-host-logs
stamp "done"
