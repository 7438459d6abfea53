import pytest
import torch

from rlfarm.rewards.graphed import GraphedRows, size_classes


def test_size_classes_are_max_rows_then_the_powers_of_two_below_it():
    assert size_classes(512) == [512, 256, 128, 64, 32, 16, 8]
    assert size_classes(300) == [300, 256, 128, 64, 32, 16, 8]
    assert size_classes(8) == [8]
    assert size_classes(5) == [5]  # below min_rows: the one class there is


def row_features(rows: torch.Tensor) -> torch.Tensor:
    """A batch function with a matmul, a reduction and a per-row result (as a reward tower is)."""
    weights = torch.arange(12, dtype=torch.float32, device=rows.device).view(4, 3) / 10
    return (rows.float().flatten(1)[:, :4] @ weights).tanh().sum(dim=1)


@pytest.mark.gpu
def test_graph_replays_match_the_function_for_every_size_and_replays_do_not_clobber_earlier_results():
    device = torch.device("cuda:0")
    graphed = GraphedRows(row_features, (2, 3), torch.uint8, device, max_rows=64)
    calls = [torch.randint(0, 256, (n, 2, 3), dtype=torch.uint8, device=device)  # fresh rows every call
             for n in (64, 33, 9, 64, 32, 8, 1, 9, 64)]  # classes 64, 64, 16, 64, 32, 8, 8, 16, 64: each replayed again
    results = [graphed(rows) for rows in calls]  # every call padded up to its class, then cut
    for rows, result in zip(calls, results):  # read after later replays of the same graph: each result its own copy
        torch.testing.assert_close(result, row_features(rows))
    # what a graph cannot serve runs the function itself: more rows than max_rows, another row shape or dtype
    many = torch.randint(0, 256, (65, 2, 3), dtype=torch.uint8, device=device)
    torch.testing.assert_close(graphed(many), row_features(many))
    rows = calls[0]
    torch.testing.assert_close(graphed(rows[:5].float()), row_features(rows[:5].float()))
    wide = torch.randint(0, 256, (5, 3, 3), dtype=torch.uint8, device=device)
    torch.testing.assert_close(graphed(wide), row_features(wide))
