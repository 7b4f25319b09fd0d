"""The schedule IR (an op table per schedule), the registry's schedules, validation and PyTorch's CSV format."""

from pipesim.schedule.csv_format import from_csv, to_csv
from pipesim.schedule.ir import Op, OpKind, Schedule, ScheduleTable, WeightPolicy, grid
from pipesim.schedule.registry import SCHEDULES, build_schedule, default_num_minibatches
from pipesim.schedule.validate import Violation, find_violations, validate

__all__ = [
    "SCHEDULES",
    "Op",
    "OpKind",
    "Schedule",
    "ScheduleTable",
    "Violation",
    "WeightPolicy",
    "build_schedule",
    "default_num_minibatches",
    "find_violations",
    "from_csv",
    "grid",
    "to_csv",
    "validate",
]
