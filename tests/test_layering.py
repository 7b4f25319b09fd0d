"""Imports point one way (DESIGN.md section 9); matplotlib only in plots, torch only in harness."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipesim"

# What each part of the package may import from pipesim (itself always allowed).
BASE = {"allocator", "errors", "jit"}
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "allocator": set(),
    "jit": {"errors"},
    "spec": BASE,
    "schedule": BASE | {"spec"},
    "engine": BASE | {"spec", "schedule"},
    "metrics": BASE | {"spec", "schedule", "engine"},
    "reuse": BASE | {"spec", "schedule"},
    "simulation": BASE | {"spec", "schedule", "engine", "metrics", "reuse"},
    "plan": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation"},
    "training": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation"},
    "search": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation", "sweep", "training"},
    "sweep": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation", "plan"},
    "export": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation", "plan", "sweep"},
    "plots": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation", "plan", "sweep"},
    "harness": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation"},
    "cli": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation", "plan", "sweep", "export", "plots",
                   "harness", "search", "training"},
    "__init__": BASE | {"spec", "schedule", "engine", "metrics", "reuse", "simulation", "plan", "sweep", "export",
                        "training"},
    "data": set(),
    "__main__": {"cli"},
}


def part_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0].removesuffix(".py")


def imported_modules(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_every_part_is_known() -> None:
    for path in PACKAGE.rglob("*.py"):
        assert part_of(path) in ALLOWED, f"{path}: add its part to ALLOWED with the imports it may make"


def test_imports_point_one_way() -> None:
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = part_of(path)
        for name in imported_modules(path):
            top = name.split(".")
            if top[0] == "matplotlib" and part != "plots":
                offences.append(f"{path.relative_to(PACKAGE)} imports matplotlib (only pipesim/plots may)")
            if top[0] == "torch" and part != "harness":
                offences.append(f"{path.relative_to(PACKAGE)} imports torch (only pipesim/harness may)")
            if top[0] != "pipesim" or len(top) < 2:
                continue
            target = top[1]
            if target != part and target not in ALLOWED[part]:
                offences.append(f"{path.relative_to(PACKAGE)} ({part}) imports pipesim.{target}")
    assert not offences, "\n".join(offences)


def test_importing_pipesim_loads_neither_matplotlib_nor_torch() -> None:
    import subprocess
    import sys

    code = "import sys, pipesim; print('matplotlib' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


HARNESS = PACKAGE / "harness"
# Shared by the launcher side and the rank side of the harness.
HARNESS_COMMON = {"pipesim.harness", "pipesim.harness.config", "pipesim.harness.recorder", "pipesim.harness.lifetime",
                  "pipesim.harness.loopback"}


# The trace and the run it records are data the harness writes; everything else of the engine it
# reaches through pipesim.simulation.
TRACE_TYPES = {"pipesim.engine.trace", "pipesim.engine.run_info"}


def test_the_harness_uses_the_public_simulation_api_not_engine_internals() -> None:
    offences = [f"{path.relative_to(PACKAGE)} imports {name}" for path in sorted(HARNESS.rglob("*.py"))
                for name in imported_modules(path)
                if name.startswith("pipesim.engine") and name not in TRACE_TYPES]
    assert not offences, "\n".join(offences)


def test_the_harness_rank_side_and_launcher_side_import_only_the_common_part_of_each_other() -> None:
    offences = []
    for path in sorted(HARNESS.rglob("*.py")):
        is_rank_side = path.parent.name == "rank"
        for name in imported_modules(path):
            if not name.startswith("pipesim.harness") or name in HARNESS_COMMON:
                continue
            if is_rank_side != name.startswith("pipesim.harness.rank"):
                offences.append(f"{path.relative_to(PACKAGE)} imports {name}")
    assert not offences, "\n".join(offences)


def test_the_harness_common_part_imports_neither_side() -> None:
    for name in sorted(HARNESS_COMMON - {"pipesim.harness"}):
        path = HARNESS / f"{name.rsplit('.', 1)[1]}.py"
        imported = [other for other in imported_modules(path) if other.startswith("pipesim.harness")]
        assert set(imported) <= HARNESS_COMMON, (path.name, imported)


def test_the_launcher_side_imports_no_torch_at_module_level() -> None:
    offences = []
    for path in sorted(HARNESS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offences += [f"{path.name} imports {n}" for n in names if n.split(".")[0] == "torch"]
    assert not offences, "\n".join(offences)
