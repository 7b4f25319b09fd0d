"""Megatron-LM's cut of a transformer profile (embedding, blocks, head) into pipeline stages, by hand."""

from __future__ import annotations

from pipesim.spec.partition import megatron_cut
from pipesim.training import megatron_partition


def test_equal_blocks_a_stage_with_the_embedding_first_and_the_head_last() -> None:
    # 8 blocks on 4 stages: profile rows 0 (embedding), 1-8 (blocks), 9 (head); two blocks a stage.
    assert megatron_cut(8, 4) == ((0, 3), (3, 5), (5, 7), (7, 10))
    assert megatron_cut(8, 1) == ((0, 10),)


def test_the_embedding_and_the_head_count_as_blocks_where_only_that_divides() -> None:
    # Llama 3 405B: 126 blocks on 16 stages, 128 / 16 = 8 rows a stage: the first holds the embedding
    # and 7 blocks, the last 7 blocks and the head.
    cut = megatron_cut(126, 16)
    assert cut is not None and len(cut) == 16
    assert cut[0] == (0, 8) and cut[1] == (8, 16) and cut[-1] == (120, 128)
    assert all(end - start == 8 for start, end in cut)
    # 10 blocks on 4 stages: 12 / 4 = 3 rows a stage.
    assert megatron_cut(10, 4) == ((0, 3), (3, 6), (6, 9), (9, 12))


def test_no_cut_where_neither_count_divides() -> None:
    assert megatron_cut(9, 4) is None and megatron_cut(8, 0) is None


def test_the_training_entry_point_gives_the_same_cut() -> None:
    assert megatron_partition(8, 4) == megatron_cut(8, 4)
