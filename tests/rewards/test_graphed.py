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
    rows = torch.randint(0, 256, (64, 2, 3), dtype=torch.uint8, device=device)
    results = {n: graphed(rows[:n]) for n in (64, 33, 32, 9, 8, 1)}  # every one padded to a class, then cut
    for n, result in results.items():  # read after later replays of the same graphs: each result is its own copy
        torch.testing.assert_close(result, row_features(rows[:n]))
    # what a graph cannot serve runs the function itself: more rows than max_rows, another row shape or dtype
    many = torch.randint(0, 256, (65, 2, 3), dtype=torch.uint8, device=device)
    torch.testing.assert_close(graphed(many), row_features(many))
    torch.testing.assert_close(graphed(rows[:5].float()), row_features(rows[:5].float()))
    wide = torch.randint(0, 256, (5, 3, 3), dtype=torch.uint8, device=device)
    torch.testing.assert_close(graphed(wide), row_features(wide))
