"""What a run that fails inside its roles says: one line, the same on screen and in status.json, without terminal
colours (rlfarm/commands/train.py). Ray's own exception types, built as Ray builds them; no cluster needed."""
import pytest
from ray.exceptions import ActorDiedError, RayTaskError

from rlfarm.commands.train import check_labels, failure_line
from rlfarm.errors import RlfarmError


def test_a_role_whose_constructor_raised_is_named_with_its_own_error():
    """The issue's case: a reward module's constructor refused an argument; Ray's message is the role's traceback,
    coloured, ending in the error."""
    traceback = ("Traceback (most recent call last):\n  File \"labeler.py\", line 51, in __init__\n"
                 "    self.model.setup(self.device)\nTypeError: BarReward.__init__() got an unexpected keyword "
                 "argument 'scale'")
    cause = RayTaskError("\x1b[36mray::Labeler.__init__()\x1b[39m", traceback,
                         TypeError("BarReward.__init__() got an unexpected keyword argument 'scale'"),
                         proctitle="\x1b[36mray::Labeler.__init__()\x1b[39m")
    line = failure_line(ActorDiedError(cause))
    assert line == ("Labeler could not start: TypeError: BarReward.__init__() got an unexpected keyword argument "
                    "'scale'"), line


def test_other_errors_keep_their_first_line_and_type():
    assert failure_line(RuntimeError("\x1b[31mboom\x1b[0m\nmore")) == "RuntimeError: boom"
    assert failure_line(RlfarmError("a problem", "its fix")) == "a problem — its fix"


def test_a_run_whose_every_label_was_quarantined_fails():
    with pytest.raises(RlfarmError, match="all 640 were quarantined, 0 labeled \\(last error: ValueError: bad"):
        check_labels({"transitions_quarantined": 640, "transitions_labeled": 0, "reward_last_error": "ValueError: bad"})
    check_labels({"transitions_quarantined": 64, "transitions_labeled": 576})  # some quarantined: the run stands
    check_labels({"env_steps": 100})  # families without labelers
