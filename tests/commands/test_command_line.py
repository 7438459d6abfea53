"""The command line as typed (rlfarm/cli.py): a whole number in e-notation is one (the README's `total_env_steps=1e6`);
`train --help` lists the groups a run picks."""
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


def test_train_help_lists_the_groups_a_run_picks_not_the_internal_ones():
    from helpers import rlfarm

    out = rlfarm("train", "--help", timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    groups = {line.split(":")[0] for line in out.stdout.split("== Config ==")[0].splitlines() if ": " in line}
    assert {"algo", "env", "reward", "topology", "experiment"} <= groups
    assert not groups & {"bench", "net", "schema", "schema/algo", "schema/env"}, groups
