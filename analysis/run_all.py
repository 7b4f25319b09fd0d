"""Regenerate every study's figures and tables (``make analysis``), timing each study."""

from __future__ import annotations

import sys
import time

import study1_schedules
import study2_pipedream
import study3_2bw
import study4_pipemare
import study5_bubble
import study6_megatron

STUDIES = (study1_schedules, study2_pipedream, study3_2bw, study4_pipemare, study5_bubble, study6_megatron)


def main(argv: list[str]) -> None:
    """Run each study's ``main`` with the same arguments (``--out DIR``, ``--quick``)."""
    started = time.perf_counter()
    for study in STUDIES:
        begun = time.perf_counter()
        study.main(argv)
        print(f"{study.__name__}: {time.perf_counter() - begun:.1f} s")
    print(f"all studies: {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
