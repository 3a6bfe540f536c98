"""The foundation's first fit behind the placement seam."""
import pytest

from allocations.seam import FreeGpu, Unplaceable, choose_whole_gpus


def gpus(layout: dict[int, list[int]]) -> list[FreeGpu]:
    return [FreeGpu(id=node * 100 + i, node_id=node, node_name=f"n{node}", index=i)
            for node, indexes in layout.items() for i in indexes]


def test_it_takes_the_first_node_with_room_lowest_indexes_first():
    assert choose_whole_gpus(gpus({1: [3], 2: [5, 1, 2]}), 2, largest_node=8) == [201, 202]


def test_it_never_splits_a_request_that_fits_on_one_node():
    with pytest.raises(Unplaceable) as refused:
        choose_whole_gpus(gpus({1: [0, 1], 2: [0, 1]}), 3, largest_node=4)
    assert refused.value.code == "fragmented"
    assert "4 GPUs are free in total but no node has 3 free (the most on one node is 2)" in refused.value.message


def test_it_spans_nodes_only_for_requests_larger_than_any_node():
    chosen = choose_whole_gpus(gpus({1: [0, 1, 2, 3], 2: [0, 1, 2, 3], 3: [0, 1]}), 6, largest_node=4)
    assert chosen == [100, 101, 102, 103, 200, 201]


def test_it_says_when_there_are_not_enough_gpus():
    with pytest.raises(Unplaceable) as refused:
        choose_whole_gpus(gpus({1: [0]}), 2, largest_node=4)
    assert refused.value.code == "insufficient_capacity"
