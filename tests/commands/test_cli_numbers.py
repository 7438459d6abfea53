"""A whole number in e-notation is one (rlfarm/cli.py: integral_numbers): the README's `total_env_steps=1e6`."""
import pytest

from rlfarm.cli import integral_numbers


@pytest.mark.parametrize("arg, read", [
    ("total_env_steps=1e6", "total_env_steps=1000000"),
    ("total_env_steps=2.5E4", "total_env_steps=25000"),
    ("total_env_steps=1e5,1e6", "total_env_steps=100000,1000000"),  # a sweep
    ("algo.lr=3e-4", "algo.lr=3e-4"),                                # not whole: as typed
    ("total_env_steps=1.25e1", "total_env_steps=1.25e1"),            # 12.5: refused by the schema, as typed
    ("seed=7", "seed=7"),
    ("--cfg", "--cfg"),
])
def test_whole_numbers_in_e_notation_are_integers(arg, read):
    assert integral_numbers(arg) == read
