"""A loop's Progress (rlfarm/loops/progress.py): named counters, the reward window and stage timings survive a
checkpoint as they were, and the wall clock continues across a resume without counting start-up."""
import pytest
import torch

from rlfarm.loops.progress import Progress


class Clock:
    def __init__(self, now=0.0):
        self.now = now

    def __call__(self):
        return self.now


def test_counters_are_read_and_added_by_name():
    progress = Progress(window=3, updates=0, env_steps=0, first_success=None)
    progress.add(updates=1, env_steps=64)
    progress.add(env_steps=64)
    progress["first_success"] = 0.25
    assert (progress["updates"], progress["env_steps"], progress["first_success"]) == (1, 128, 0.25)
    with pytest.raises(KeyError):
        progress["episodes"] = 1  # undeclared: a typo must not start a new counter
    with pytest.raises(ValueError, match="wall_s"):
        Progress(window=3, wall_s=0)


def test_the_window_keeps_the_newest_values_and_is_full_at_its_length():
    progress = Progress(window=3)
    assert progress.window_mean() is None and progress.window_mean(empty=0.0) == 0.0
    progress.window.extend([1.0, 2.0])
    assert not progress.window_full
    progress.window.extend([3.0, 4.0])
    assert progress.window_full and progress.window_mean() == 3.0


def test_state_dict_round_trip_through_a_checkpoint_file(tmp_path):
    clock = Clock()
    saved = Progress(window=3, timings=("step_s",), clock=clock, updates=0, samples=0, first_success=None)
    for step in range(4):
        saved.add(updates=1, samples=8)
        saved.window.append(float(step))
        saved.record_timings({"step_s": 0.5 + step, "other_s": 9.0})
    clock.now = 12.0
    torch.save({"extra": saved.state_dict()}, tmp_path / "step.pt")
    state = torch.load(tmp_path / "step.pt", weights_only=True)["extra"]  # what a learner's load returns
    assert state["updates"] == 4 and state["wall_s"] == 12.0  # flat: the counters by their names

    restored = Progress(window=3, timings=("step_s",), clock=Clock(100.0), updates=0, samples=0, first_success=None)
    restored.load_state_dict(state)
    assert restored.counters == {"updates": 4, "samples": 32, "first_success": None}
    assert list(restored.window) == [1.0, 2.0, 3.0] and restored.window.maxlen == 3
    assert restored.timings == {"step_s": [0.5, 1.5, 2.5, 3.5]}
    assert restored.timing_medians() == {"step_s": 2.0}
    assert restored.state_dict() == state


def test_the_wall_clock_continues_across_a_resume_and_skips_start_up():
    clock = Clock(50.0)
    first = Progress(window=1, clock=clock)
    clock.now = 60.0  # start-up: roles import, build models
    first.restart_clock()
    clock.now = 65.0
    assert first.wall_s == 5.0 and first.session_s == 5.0
    state = first.state_dict()

    clock.now = 1000.0  # the resumed process starts
    resumed = Progress(window=1, clock=clock)
    resumed.load_state_dict(state)
    clock.now = 1010.0  # its start-up
    resumed.restart_clock()
    assert resumed.wall_s == 5.0
    clock.now = 1013.0
    assert resumed.wall_s == 8.0 and resumed.session_s == 3.0
