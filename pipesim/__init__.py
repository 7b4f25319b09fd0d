"""pipesim: simulate and analyze pipeline-parallel training schedules."""

from pipesim.allocator import keep_freed_memory
from pipesim.engine.trace import Trace
from pipesim.errors import ConfigError, PipesimError, ScheduleError
from pipesim.metrics import Metrics, StageMetrics, compute_metrics
from pipesim.schedule import Op, OpKind, Schedule, build_schedule, validate
from pipesim.simulation import Result, make_plan, simulate, simulate_plan
from pipesim.spec import (
    Plan,
    Profile,
    Topology,
    load_plan,
    load_profile,
    load_topology,
    uniform_profile,
)
from pipesim.spec.cluster import Cluster, load_cluster
from pipesim.spec.device import Device, load_device
from pipesim.spec.model_files import load_model
from pipesim.spec.transformer_profile import calibrated_efficiency, transformer_profile
from pipesim.training import TrainingResult, simulate_training

__version__ = "0.1.0"

keep_freed_memory()  # before any run: a run's speed must not depend on what the process freed earlier

__all__ = [
    "Cluster",
    "ConfigError",
    "Device",
    "Metrics",
    "Op",
    "OpKind",
    "PipesimError",
    "Plan",
    "Profile",
    "Result",
    "Schedule",
    "ScheduleError",
    "StageMetrics",
    "Topology",
    "TrainingResult",
    "Trace",
    "__version__",
    "build_schedule",
    "calibrated_efficiency",
    "compute_metrics",
    "load_cluster",
    "load_device",
    "load_model",
    "load_plan",
    "load_profile",
    "load_topology",
    "make_plan",
    "simulate",
    "simulate_plan",
    "simulate_training",
    "transformer_profile",
    "uniform_profile",
    "validate",
]
