"""StageClock: every second counts once, in the innermost stage in progress (nested stages pause the outer one)."""
import time

import numpy as np
import torch

from rlfarm.rewards.staging import StagedUpload
from rlfarm.roles.stage_clock import StageClock


def test_a_nested_stage_takes_its_seconds_out_of_the_outer_one():
    clock = StageClock("launch", "upload")
    started = time.perf_counter()
    with clock.timing("launch"):
        time.sleep(0.05)
        with clock.timing("upload"):
            time.sleep(0.1)
            inside = clock.snapshot()  # only the innermost stage runs: launch is paused at ~0.05
        time.sleep(0.05)
    whole = time.perf_counter() - started
    seconds = clock.snapshot()
    assert 0.09 <= seconds["upload"] < 0.2
    assert 0.09 <= seconds["launch"] < 0.2 and inside["launch"] < 0.09
    assert abs(seconds["launch"] + seconds["upload"] - whole) < 0.01  # nothing counted twice, nothing lost


def test_a_staged_upload_times_its_host_copy_under_the_clock_it_is_given():
    clock = StageClock("launch", "upload", "upload_wait")
    upload = StagedUpload(torch.device("cpu"), 64, clock)
    rows = np.arange(64 * 12, dtype=np.uint8).reshape(64, 4, 3)
    with clock.timing("launch"):
        out = upload([rows[:20], rows[20:]], "frames", 0)
    assert torch.equal(out, torch.from_numpy(rows))
    seconds = clock.snapshot()
    assert seconds["upload"] > 0 and seconds["upload_wait"] == 0  # on the CPU: a copy, no staging buffer to wait for
