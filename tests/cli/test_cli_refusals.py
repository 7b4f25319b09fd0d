"""simulate and schedule refuse bad options up front with one line and exit 2, naming the option;
a refused command changes nothing on disk."""

from __future__ import annotations

import json
from pathlib import Path

from test_cli_outputs import in_process

UNIFORM = "layers=8,forward_ms=1,backward_ms=2,activation_bytes=1000,param_bytes=4000"


def test_a_plan_without_a_partition_balances_compute_and_prints_it(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema": "pipesim.plan/1", "schedule": "1f1b", "num_stages": 2,
                                "num_microbatches": 4}))
    args = ("simulate", "--uniform", UNIFORM, "--plan", str(plan))
    table = in_process(*args)
    assert table.returncode == 0, table.stderr
    assert [line.split()[4] for line in table.stdout.splitlines() if line.split()[:2] in (["0", "│"], ["1", "│"])
            and line.count("│") > 8] == ["0:4", "4:8"]
    assert json.loads(in_process(*args, "--json").stdout)["partition"] == [[0, 4], [4, 8]]
