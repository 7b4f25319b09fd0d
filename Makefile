# Set-up and the main jobs. Every target creates or reuses the virtual environment .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Two levels: the simulator alone (what make demo needs), and everything (torch, numba, test tools).
CORE_STAMP := $(VENV)/.installed-pipesim-core
STAMP := $(VENV)/.installed-pipesim
DEMO_OUT ?= report
TORCH ?= torch==2.13.0

.PHONY: demo test bench venv harness clean

$(CORE_STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(CORE_STAMP)

# torch is installed first, pinned, so that the harness extra (pipesim[harness]) does not pull another build;
# TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" picks the CPU-only wheel.
$(STAMP): $(CORE_STAMP)
	$(PY) -m pip install --quiet $(TORCH)
	$(PY) -m pip install --quiet -e '.[test,harness,fast]'
	touch $(STAMP)

venv: $(STAMP)

# The torch harness, numba and the test tools (what make test installs too).
harness: $(STAMP)

# The main job: simulate VGG-16 (PipeDream's measured profile) on 4 stages with 1F1B and write
# a report folder: metrics.json, trace.json, trace.perfetto.json, timeline.png and report.html.
# It needs only the simulator: no torch, no numba.
demo: $(CORE_STAMP)
	$(VENV)/bin/pipesim simulate --profile traces/vgg16.json --stages 4 --microbatches 8 \
		--schedule 1f1b --bandwidth 25Gbit/s --latency 5us --out $(DEMO_OUT)
	$(VENV)/bin/pipesim report $(DEMO_OUT) --out $(DEMO_OUT)/report.html

# The test suite, with hypothesis's derandomized "ci" profile.
test: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --hypothesis-profile=ci

# Regenerate every figure and table under analysis/ (analysis/README.md); about 30 s to a minute.
.PHONY: analysis
analysis: $(STAMP)
	$(PY) analysis/run_all.py

clean:
	rm -rf $(VENV) $(DEMO_OUT) .pytest_cache .hypothesis

# Engine speed: DES and analytic ops/s against a bare SimPy loop, simulate() per point, peak RSS;
# writes its section of benchmarks/RESULTS.md (takes a few minutes).
.PHONY: bench-engines
bench-engines: $(STAMP)
	$(PY) benchmarks/bench_engines.py

# Every benchmark, each rewriting only its own section of benchmarks/RESULTS.md.
bench: bench-engines bench-cold-start bench-peers bench-planner bench-schedules bench-sweep bench-prepare \
	bench-variance bench-validate bench-search bench-op-cost bench-memory bench-published

.PHONY: bench-published
# Published training runs (../shared/reference/published_runs.json, or RUNS=FILE) against the op cost
# model's prediction with the shipped device and cluster files: error per row, mean, median, worst and
# the direction of each scaling step, into benchmarks/RESULTS.md (a few seconds).
bench-published: $(CORE_STAMP)
	$(PY) benchmarks/bench_published.py $(if $(RUNS),--runs $(RUNS)) --write

.PHONY: bench-model-cost
# What the op cost model costs: simulate --model and search per candidate against BASELINE=TREE (e.g.
# mkdir /tmp/base && git archive main | tar -x -C /tmp/base), alternated, into benchmarks/RESULTS.md.
bench-model-cost: $(STAMP)
	$(PY) benchmarks/bench_model_cost.py --baseline $(BASELINE) --write

.PHONY: bench-device-step
# Whole training steps on one GPU (three small transformers, the 1.7B hold-out GPT) against the op
# cost model: MEASURE=1 on a CUDA machine measures (benchmarks/data/STEP.json), otherwise the
# measurement kept in benchmarks/data is priced and the table goes into benchmarks/RESULTS.md.
STEP ?= benchmarks/data/h200-step-2026-11-28.json
bench-device-step: $(CORE_STAMP)
	$(if $(MEASURE),$(PY) benchmarks/bench_device_step.py --measure --out $(STEP),\
	$(PY) benchmarks/bench_device_step.py --predict $(STEP) --device $(or $(DEVICE),h200) --write)

.PHONY: bench-gpu
# Needs a CUDA GPU, so not part of bench: CUDA-event layer profiles against a whole stage's step
# timed on the card (benchmarks/bench_gpu.py; its table goes into benchmarks/RESULTS.md by hand).
bench-gpu: $(STAMP)
	$(PY) benchmarks/bench_gpu.py

.PHONY: bench-page-faults
# Page faults and time per run, glibc's adaptive malloc thresholds against pipesim's fixed ones,
# against BASELINE=TREE (a source tree of the commit to compare with), into benchmarks/RESULTS.md.
bench-page-faults: $(STAMP)
	$(PY) benchmarks/bench_page_faults.py --baseline $(BASELINE) --label "$(BASELINE_LABEL)" --write

.PHONY: bench-op-cost
# simulate() per op of every schedule against the 1F1B family's at p=64, m=512, warm and on a fresh
# process's first call, into its section of benchmarks/RESULTS.md (about a minute).
bench-op-cost: $(STAMP)
	$(PY) benchmarks/bench_op_cost.py --write

.PHONY: bench-memory
# Peak memory per op by engine at 1M and 4M ops (each run a process of its own, a few minutes), the
# figure behind --max-ops (pipesim.simulation.BYTES_PER_OP), into benchmarks/RESULTS.md.
bench-memory: $(STAMP)
	$(PY) benchmarks/bench_memory_per_op.py

.PHONY: bench-search
# pipesim search for Llama-3 70B on 512 H100, GPT-3 175B on 384 A100-80GB and Llama-3 405B on 16,384
# H100, against an import baseline (BASELINE=TREE also times an older tree once), into benchmarks/RESULTS.md.
bench-search: $(STAMP)
	$(PY) benchmarks/bench_search.py

.PHONY: bench-planner
# Planner speed (PipeDream's partitioner, 2BW's planner) into its section of benchmarks/RESULTS.md,
# then the long brute-force check of the partitioner.
bench-planner: $(STAMP)
	$(PY) benchmarks/bench_planner.py
	$(PY) -m pytest -q -m slow tests/plan/test_partition.py --hypothesis-profile=ci

# The sweep benchmark of issue 7 (10,080 points) into its section of benchmarks/RESULTS.md.
.PHONY: bench-sweep
bench-sweep: $(STAMP)
	$(PY) benchmarks/bench_sweep.py

.PHONY: bench-schedules
# Speed on several stages per rank, split backward and shared NICs into its section of
# benchmarks/RESULTS.md; BASELINE=TREE adds an A/B of lowering, engines and metrics against
# another source tree (e.g. git archive main | tar -x -C /tmp/main).
bench-schedules: $(STAMP)
	$(PY) benchmarks/bench_schedules.py $(if $(BASELINE),--baseline $(BASELINE) --label "$(BASELINE_LABEL)")

.PHONY: bench-variance
# Host speed drift with no ranks running: a fixed unit of work in 1-second windows, on 1 and 2 cores,
# into its section of benchmarks/RESULTS.md (about 2 minutes); the noise floor under bench-validate.
bench-variance: $(STAMP)
	$(PY) benchmarks/variance_ab.py

.PHONY: bench-validate
# Prediction against runs (the torch harness), one table: schedule x (emulated error, replay error, real
# median error, noise floor, versions matched, peak memory error), MLP and transformer on 2 and 4 ranks,
# runs interleaved across schedules, machine and load noted, and where each error comes from, op by op;
# into its section of benchmarks/RESULTS.md. CASES=4-rank (or 2-rank, mlp, transformer, a case's number;
# comma-separated) picks cases, RUNS=N the runs per schedule, OUT=DIR also writes each case's tables there,
# CALIBRATE=run calibrates right before every real run (default round: once per partition and round).
bench-validate: $(STAMP)
	$(PY) benchmarks/bench_validate.py $(if $(CASES),--cases $(CASES)) $(if $(RUNS),--runs $(RUNS)) \
		$(if $(OUT),--out $(OUT)) $(if $(CALIBRATE),--calibrate $(CALIBRATE))

# prepare() per point, fresh and with the schedule kept, compiled and plain kernels, into its
# section of benchmarks/RESULTS.md (a minute or two); BASELINE=tree adds another tree's prepare()
# in alternating rounds (e.g. a worktree of main).
.PHONY: bench-prepare
bench-prepare: $(STAMP)
	$(PY) benchmarks/bench_prepare.py $(if $(BASELINE),--baseline $(BASELINE))

.PHONY: bench-sweep-full
# The 10,080-point sweep of issue 7 run for real through run_sweep on an embedded cluster of 2
# workers (a few minutes), against the serial projection, into benchmarks/RESULTS.md.
bench-sweep-full: $(STAMP)
	$(PY) benchmarks/bench_sweep.py --full

.PHONY: bench-peers
# pipesim beside bare SimPy, a plain-Python longest path and torch's unit-step simulator, per op.
bench-peers: $(STAMP)
	$(PY) benchmarks/bench_peers.py --write

.PHONY: bench-cold-start
# One-shot CLI runs against the interpreter's start-up, and --samples against BASELINE=TREE when given.
bench-cold-start: $(STAMP)
	$(PY) benchmarks/bench_cold_start.py $(if $(BASELINE),--baseline $(BASELINE) --label "$(BASELINE_LABEL)") --write

.PHONY: mutants
# Mutation benchmark (issue 38): each hand-written bug of benchmarks/mutations.py in the code behind a
# headline number, on a fresh copy of the tree, against its guard tests with -x; every one must be
# caught (about 25 minutes here); into its section of benchmarks/RESULTS.md.
mutants: $(STAMP)
	$(PY) benchmarks/mutants.py

.PHONY: bench-kernel-ab
# The engines of this tree against another source tree in one run (BASELINE=TREE, e.g.
# mkdir /tmp/base && git archive COMMIT | tar -x -C /tmp/base), into its section of benchmarks/RESULTS.md.
bench-kernel-ab: $(STAMP)
	$(PY) benchmarks/bench_kernel_ab.py --baseline $(BASELINE) --label "$(BASELINE_LABEL)" --write
