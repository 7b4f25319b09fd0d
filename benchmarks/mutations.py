"""The hand-written mutations of ``make mutants`` (benchmarks/mutants.py): bugs in the code behind
pipesim's headline numbers that the suite must catch.

Each is a file, an exact text that must occur once in it, the text that replaces it, what that
breaks, and the test files that guard that code (run in that order, first failure stops). To add
one, copy a line of the code as it is now into ``old``, write the plausible slip in ``new``, and
name the number it would get wrong. When the code moves on, ``mutants.py --check`` (and
tests/test_mutations_list.py) names every mutation whose text is gone: rewrite it against the
new code, keeping the kind of slip and the number it guards.
"""

from __future__ import annotations

from typing import NamedTuple


class Mutation(NamedTuple):
    """One deliberate bug: ``old`` (found exactly once in ``file``) becomes ``new``; with
    ``refresh_golden`` the golden wavefront files are then regenerated from the broken code, as a
    careless ``PIPESIM_REGEN_GOLDEN=1`` would bless it, before its tests run."""

    file: str
    old: str
    new: str
    breaks: str
    tests: tuple[str, ...]
    refresh_golden: bool = False


# The guard test files of each area, fastest and closest first.
KERNEL = ("tests/engine/test_closed_forms.py", "tests/engine/test_closed_forms_exact.py",
          "tests/engine/test_engine_model.py")
MEMORY = ("tests/engine/test_closed_forms.py", "tests/metrics/test_recompute_memory.py",
          "tests/engine/test_analytic.py")
METRICS = ("tests/metrics/test_metrics_meaning.py", "tests/metrics/test_metrics_exposed.py",
           "tests/engine/test_closed_forms.py")
VERSIONS = ("tests/engine/test_closed_forms.py", "tests/schedule/test_order_invariants.py",
            "tests/metrics/test_metrics_meaning.py")
SCHEDULES = ("tests/schedule/test_schedules.py", "tests/schedule/test_golden_wavefronts.py")
# After a golden refresh the golden test passes by construction: what must catch it is the rest.
REFRESHED = ("tests/schedule/test_wavefronts_by_hand.py", "tests/schedule/test_golden_wavefronts.py",
             "tests/schedule/test_schedules.py")
CAPACITY = ("tests/cli/test_capacity_numbers.py", "tests/cli/test_capacity_cli.py")
OP_COSTS = ("tests/spec/test_parallel.py", "tests/spec/test_transformer.py", *CAPACITY)
PLANNER = ("tests/plan/test_planner_2bw.py", "tests/plan/test_partition.py", "tests/plan/test_plan_choice.py")
VALIDATE = ("tests/harness/test_validation_error.py", "tests/harness/test_harness_emulated.py")
READERS = ("tests/spec/test_input_files.py", "tests/test_fuzz.py")
REFUSALS = ("tests/cli/test_cli_refusals.py", "tests/cli/test_capacity_cli.py")

MUTATIONS: list[Mutation] = [
    # --- the timing kernel: start = max(rank free, input arrived); sends queue on their link ---
    Mutation("pipesim/engine/kernel.py",
             "        if ready > t:\n            t = ready\n",
             "        t = ready\n",
             "an op starts when its input arrives even if its rank is still busy", KERNEL),
    Mutation("pipesim/engine/kernel.py",
             "            done = done + floats[transfer + k]\n",
             "            done = done + floats[hold + k]\n",
             "a message arrives without the link's latency", KERNEL),
    Mutation("pipesim/engine/kernel.py",
             "                floats[link_free + channel] = done + floats[hold + k]\n",
             "                floats[link_free + channel] = done\n",
             "a send does not hold its link: messages overtake the bandwidth", KERNEL),
    Mutation("pipesim/engine/kernel.py",
             "    return not shortest >= float(ops.hold_by_link_s.max())",
             "    return not shortest >= float(ops.hold_by_link_s.min())",
             "the link queue is skipped where a long send would still be on the link", KERNEL),
    Mutation("pipesim/spec/topology.py",
             "        hold_s = num_bytes / bandwidth if num_bytes else 0.0\n",
             "        hold_s = num_bytes / bandwidth / 2 if num_bytes else 0.0\n",
             "transfers take half their bytes over the bandwidth", KERNEL),
    Mutation("pipesim/spec/stages.py",
             "        f = sum(columns.forward_s[start:end]) / speed\n",
             "        f = sum(columns.forward_s[start:end])\n",
             "a faster device runs its forwards at speed 1", ("tests/schedule/test_multi_stage.py", *KERNEL)),
    # --- memory events ---
    Mutation("pipesim/engine/memory.py",
             "            delta[3 * s + c], count[3 * s + c] = params[s] * multiplier if c == OPTIMIZER else params[s], 1",
             "            delta[3 * s + c], count[3 * s + c] = params[s] * multiplier if c != OPTIMIZER else params[s], 1",
             "the optimizer-state multiplier scales weights and gradients instead of the optimizer state",
             ("tests/cli/test_capacity_numbers.py", *MEMORY)),
    Mutation("pipesim/engine/memory.py",
             "                bytes_of[j], count_of[j] = -stash[s] - working[s], -1",
             "                bytes_of[j], count_of[j] = -stash[s], -1",
             "a backward never frees the working bytes recomputation re-created", MEMORY),
    Mutation("pipesim/engine/memory.py",
             "            bits[g] = 6 if last_user[key] < g else 2\n",
             "            bits[g] = 2\n",
             "an update never frees the version it supersedes: stashed versions pile up", MEMORY),
    Mutation("pipesim/engine/memory.py",
             "                bytes_of[j], count_of[j] = stash[s], 1\n",
             "                bytes_of[j], count_of[j] = stash[s] / 2, 1\n",
             "a forward stashes half its activation bytes", MEMORY),
    # --- metrics ---
    Mutation("pipesim/metrics/__init__.py",
             "    samples = info.num_microbatches * info.microbatch_size\n",
             "    samples = info.num_microbatches\n",
             "throughput ignores the microbatch size", METRICS),
    Mutation("pipesim/metrics/__init__.py",
             "    return (high - low) / max(1, num_minibatches - warmup - cooldown)",
             "    return (high - low) / max(1, num_minibatches - warmup)",
             "iteration time divides the window by one minibatch too many", METRICS),
    Mutation("pipesim/metrics/__init__.py",
             "        return float(ends[0]), float(ends[k - 2]), 1, 1",
             "        return float(ends[0]), float(ends[k - 1]), 1, 1",
             "the steady-state window takes in the drain minibatch", METRICS),
    Mutation("pipesim/metrics/__init__.py",
             "        bubble_fraction=1.0 - float(np.mean(utilization_by_device)),",
             "        bubble_fraction=1.0 - float(np.max(utilization_by_device)),",
             "the overall bubble is the busiest device's, not the mean", METRICS),
    Mutation("pipesim/metrics/__init__.py",
             "    busy = np.clip(np.minimum(s[\"end_s\"][mine], high) - np.maximum(s[\"start_s\"][mine], low), 0.0, None)",
             "    busy = np.clip(s[\"end_s\"][mine] - np.maximum(s[\"start_s\"][mine], low), 0.0, None)",
             "utilization counts busy time past the window's end", METRICS),
    Mutation("pipesim/metrics/kernels.py",
             "            if not seen[g] or total > peaks[g]:",
             "            if not seen[g] or total < peaks[g]:",
             "peak memory is the lowest level, not the highest", METRICS),
    Mutation("pipesim/metrics/kernels.py",
             "            high_edge = min(min(start[rows[j]], end[s]), high)",
             "            high_edge = min(start[rows[j]], high)",
             "exposed communication counts the wait after the message arrived", METRICS),
    Mutation("pipesim/metrics/__init__.py",
             "        peak_memory_bytes=max(device_peaks, default=0.0),",
             "        peak_memory_bytes=device_peaks[0] if device_peaks else 0.0,",
             "the run's peak memory is the first device's, not the largest", METRICS),
    # --- versions and staleness ---
    Mutation("pipesim/schedule/versions.py",
             "        version = schedule.minibatch - 1  # off a U, the minibatch is the microbatch's",
             "        version = schedule.minibatch - 2  # off a U, the minibatch is the microbatch's",
             "2BW runs minibatch t on version t-2: a delay of two steps", VERSIONS),
    Mutation("pipesim/schedule/versions.py",
             "        return np.minimum(now, forward_version, out=forward_version)",
             "        return now",
             "PipeDream's backward uses the current weights, not its forward's stash", VERSIONS),
    Mutation("pipesim/metrics/kernels.py",
             "            value = version[r] - forward_version[g * total + micro[r]]\n"
             "            if not has_discrepancy[g] or value > discrepancy_max[g]:",
             "            value = forward_version[g * total + micro[r]] - version[r]\n"
             "            if not has_discrepancy[g] or value > discrepancy_max[g]:",
             "discrepancy is version(F) - version(B), the wrong sign", VERSIONS),
    Mutation("pipesim/metrics/kernels.py",
             "        index = first + np.searchsorted(update_position[first:stop], position[r])",
             "        index = first + np.searchsorted(update_position[first:stop], position[r]) + 1",
             "forward delay counts the update after the one that consumes the gradient", VERSIONS),
    # --- schedules' order and dependencies, some blessed by a golden refresh ---
    Mutation("pipesim/schedule/one_f_one_b.py",
             "else np.minimum(warmup_rounds * (p - stages) - 1, n)",
             "else np.minimum(warmup_rounds * (p - stages), n)",
             "1F1B warms up with one forward too many (p - s instead of p - s - 1)", SCHEDULES),
    Mutation("pipesim/schedule/zb_h2.py",
             "warmup=2 * (p - 1 - s), weight_lag=2 * s)",
             "warmup=2 * (p - 1 - s) + 1, weight_lag=2 * s)",
             "ZB-H2 warms up with one forward too many; golden files refreshed", REFRESHED, refresh_golden=True),
    Mutation("pipesim/schedule/looped_bfs.py",
             "microbatch=np.tile(np.concatenate([micro, micro[::-1]]), r))",
             "microbatch=np.tile(np.concatenate([micro, micro]), r))",
             "looped BFS runs its backwards in rising microbatch order; golden files refreshed", REFRESHED,
             refresh_golden=True),
    Mutation("pipesim/schedule/deps.py",
             "        return (Op(stage - 1, OpKind.F, microbatch),) if stage > 0 else ()",
             "        return ()",
             "a forward no longer waits for the previous stage's activation; golden files refreshed",
             (*REFRESHED, "tests/schedule/test_order_invariants.py"), refresh_golden=True),
    # --- capacity: tokens/s, MFU, the memory verdict ---
    Mutation("pipesim/search.py",
             "    tokens = samples_per_s * dp * seq_len\n",
             "    tokens = samples_per_s * seq_len\n",
             "tokens/s counts one pipeline of D", CAPACITY),
    Mutation("pipesim/search.py",
             "    return tokens, 3 * forward_flops_per_token * tokens / (num_gpus * peak_flops)",
             "    return tokens, 2 * forward_flops_per_token * tokens / (num_gpus * peak_flops)",
             "MFU counts the forward's FLOPs and one backward's (2x), not 3x", CAPACITY),
    Mutation("pipesim/cli/capacity.py",
             "        gpus = data[\"num_ranks\"] * capacity.tp * capacity.dp",
             "        gpus = data[\"num_ranks\"] * capacity.tp",
             "MFU and the GPU count leave out the data-parallel pipelines", CAPACITY),
    Mutation("pipesim/cli/capacity.py",
             "                              \"global_throughput_samples_per_s\": data[\"throughput_samples_per_s\"] * capacity.dp}",
             "                              \"global_throughput_samples_per_s\": data[\"throughput_samples_per_s\"]}",
             "global throughput is one pipeline's", CAPACITY),
    Mutation("pipesim/metrics/__init__.py",
             "            \"fits\": all(value >= 0 for value in headroom)}",
             "            \"fits\": all(value > 0 for value in headroom)}",
             "a device exactly at its budget is said not to fit", CAPACITY),
    Mutation("pipesim/metrics/__init__.py",
             "    headroom = [budget_bytes - peak for peak in device_peak_memory_bytes]",
             "    headroom = [budget_bytes - max(device_peak_memory_bytes) for peak in device_peak_memory_bytes]",
             "every device's headroom is the fullest device's", CAPACITY),
    Mutation("pipesim/spec/parallel.py",
             "    return multiplier / dp if zero_stage == 1 else multiplier",
             "    return multiplier",
             "ZeRO-1 does not shard the optimizer state", CAPACITY),
    # --- op costs and collectives ---
    Mutation("pipesim/spec/parallel.py",
             "    return 2 * (degree - 1) / degree * num_bytes / bandwidth_bytes_per_s",
             "    return (degree - 1) / degree * num_bytes / bandwidth_bytes_per_s",
             "a ring all-reduce moves (d-1)/d of the bytes instead of 2(d-1)/d", OP_COSTS),
    Mutation("pipesim/spec/parallel.py",
             "        allreduces = 2 * ring_allreduce_s(layer.activation_bytes, tp, bandwidth_bytes_per_s)",
             "        allreduces = ring_allreduce_s(layer.activation_bytes, tp, bandwidth_bytes_per_s)",
             "tensor parallelism adds one all-reduce each way instead of two", OP_COSTS),
    Mutation("pipesim/spec/parallel.py",
             "        finished = max(finished, ready) + allreduce",
             "        finished = finished + allreduce",
             "an overlapped all-reduce starts before its gradient is ready", OP_COSTS),
    Mutation("pipesim/spec/parallel.py",
             "    return global_batch // per_step",
             "    return global_batch // microbatch_size",
             "M from the global batch ignores the data-parallel degree", OP_COSTS),
    Mutation("pipesim/spec/transformer.py",
             "    return 2.0 * tokens * weights, 4.0 * tokens * seq_len * h",
             "    return 2.0 * tokens * weights, 2.0 * tokens * seq_len * h",
             "attention FLOPs count QK^T but not the product with V", OP_COSTS),
    Mutation("pipesim/spec/transformer_profile.py",
             "                   backward_weight=matmul / t / rate, sent=sent, stash=stash,",
             "                   backward_weight=matmul / rate, sent=sent, stash=stash,",
             "the weight gradient is not split over the tensor-parallel ranks", OP_COSTS),
    Mutation("pipesim/spec/devices.py",
             "        return PlacedLinks(\"tp-in-node\", nvlink, nic, nic, spec)",
             "        return PlacedLinks(\"tp-in-node\", nvlink, nvlink, nic, spec)",
             "pipeline hops between nodes go over NVLink", OP_COSTS),
    # --- the planners' cost model ---
    Mutation("pipesim/plan/costs.py",
             "        per_weight_byte = self.versions(inflight) + 1 + self.optimizer_state_multiplier",
             "        per_weight_byte = self.versions(inflight) + self.optimizer_state_multiplier",
             "the planner forgets the gradient buffer in a stage's memory", PLANNER),
    Mutation("pipesim/plan/costs.py",
             "    return -(-devices_to_end // replicas)",
             "    return devices_to_end // replicas",
             "in-flight microbatches of a replicated stage round down", PLANNER),
    Mutation("pipesim/plan/costs.py",
             "        factor = self.allreduce_factor * (replicas - 1) / replicas / self.microbatches_per_allreduce",
             "        factor = self.allreduce_factor * (replicas - 1) / replicas",
             "2BW's all-reduce is charged every microbatch, not once per m", PLANNER),
    # --- validate: the error, the replay error and the noise floor ---
    Mutation("pipesim/harness/comparison.py",
             "    return (predicted - measured) / measured",
             "    return (measured - predicted) / measured",
             "validate's error has the wrong sign", VALIDATE),
    Mutation("pipesim/harness/comparison.py",
             "        return statistics.median(run.iteration_time_error for run in self.runs)",
             "        return statistics.mean(run.iteration_time_error for run in self.runs)",
             "the median error is a mean", VALIDATE),
    Mutation("pipesim/harness/comparison.py",
             "        return max(abs(t - middle) for t in times) / middle if middle > 0 else 0.0",
             "        return max(abs(t - middle) for t in times) / max(times) if middle > 0 else 0.0",
             "the noise floor is over the slowest run, not the median", VALIDATE),
    Mutation("pipesim/harness/comparison.py",
             "        return statistics.median(relative_error(run.replayed.iteration_time_s, run.measured.iteration_time_s)",
             "        return statistics.median(relative_error(run.predicted.iteration_time_s, run.measured.iteration_time_s)",
             "the replay error reports the prediction's error", VALIDATE),
    Mutation("pipesim/harness/rank/runtime.py",
             "            self.device_free = device_start + self.durations_s[position]\n",
             "            self.device_free = device_start + self.durations_s[position] / 2\n",
             "the emulated device waits out half of each op's duration", ("tests/harness/test_harness_emulated.py",)),
    # --- readers and refusals ---
    Mutation("pipesim/spec/profile.py",
             "    forward_s: Float = Field(ge=0)\n",
             "    forward_s: Float\n",
             "a profile with a negative forward time is read", READERS),
    Mutation("pipesim/spec/validation.py",
             "    model_config = ConfigDict(frozen=True, extra=\"forbid\", allow_inf_nan=False)",
             "    model_config = ConfigDict(frozen=True, extra=\"forbid\", allow_inf_nan=True)",
             "input files may carry NaN and inf", READERS),
    Mutation("pipesim/cli/__init__.py",
             "        except PipesimError as exc:\n            click.echo(f\"pipesim: error: {exc}\", err=True)\n"
             "            sys.exit(2)",
             "        except PipesimError as exc:\n            click.echo(f\"pipesim: error: {exc}\", err=True)\n"
             "            sys.exit(1)",
             "bad input exits 1, not 2", REFUSALS),
    Mutation("pipesim/cli/options.py",
             "    for key in (\"forward_ms\", \"backward_ms\", \"activation_bytes\", \"param_bytes\", *UNIFORM_EXTRA_KEYS):",
             "    for key in (\"forward_ms\", \"backward_ms\", \"activation_bytes\", *UNIFORM_EXTRA_KEYS):",
             "--uniform takes a negative param_bytes", REFUSALS),
]
