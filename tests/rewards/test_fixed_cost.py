"""FixedCostReward: the env's reward at an exact cost (sleep on CPU, a spinning kernel on a GPU)."""
import time

import numpy as np
import pytest
from hydra.utils import instantiate

from rlfarm.config import compose
from rlfarm.rewards import RewardModelError
from rlfarm.rewards.fixed_cost import FixedCostReward


def test_cost_is_per_piece_of_max_batch_plus_per_transition():
    model = FixedCostReward(batch_ms=10, item_us=100, max_batch=512)
    assert model.cost_s(512) == pytest.approx(0.010 + 0.0512)
    assert model.cost_s(513) == pytest.approx(0.020 + 0.0513)  # a second piece pays the call again
    assert model.cost_s(1) == pytest.approx(0.010 + 0.0001)


def test_returns_the_env_reward_after_its_cost_on_cpu():
    model = instantiate(compose("train", ["reward=fixed_cost", "reward.batch_ms=30", "reward.item_us=1000"]).reward)
    model.setup("cpu")
    rewards = np.array([0.5, -1.0, 2.0], dtype=np.float64)
    started = time.perf_counter()
    out = model({"env_reward": rewards})
    assert time.perf_counter() - started >= 0.030 + 0.003
    assert out.dtype == np.float32 and out.tolist() == [0.5, -1.0, 2.0]
    assert model.needs == ("env_reward",) and model.frame_size is None


def test_a_started_call_returns_at_once_and_calls_run_one_after_another():
    """Like a model on a GPU: `start` queues the call, a second call starts after the first ends."""
    model = FixedCostReward(batch_ms=100, item_us=0)
    model.setup("cpu")
    started = time.monotonic()
    first = model.start({"env_reward": np.array([1.0, 2.0])})
    second = model.start({"env_reward": np.array([3.0])})
    assert time.monotonic() - started < 0.05 and not first.ready() and not second.ready()
    assert first.result().tolist() == [1.0, 2.0] and not second.ready()
    assert second.result().tolist() == [3.0] and time.monotonic() - started >= 0.2


def test_bad_costs_are_refused():
    with pytest.raises(RewardModelError, match="max_batch >= 1"):
        FixedCostReward(max_batch=0)
    with pytest.raises(RewardModelError, match="batch_ms, item_us >= 0"):
        FixedCostReward(batch_ms=-1)


@pytest.mark.gpu
def test_the_gpu_is_busy_for_the_cost():
    import torch

    model = FixedCostReward(batch_ms=20, item_us=0, max_batch=512)
    model.setup("cuda:0")
    model({"env_reward": np.zeros(4)})
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model({"env_reward": np.zeros(600)})  # two pieces: 40 ms of kernel
    end.record()
    end.synchronize()
    assert 0.8 * 40 <= start.elapsed_time(end) <= 1.25 * 40
    # started, the call is queued on the GPU and the host goes on (the labeler prepares its next bus meanwhile)
    queued = time.perf_counter()
    pending = model.start({"env_reward": np.ones(600)})
    assert time.perf_counter() - queued < 0.02 and not pending.ready()
    assert pending.result().tolist() == [1.0] * 600 and pending.ready()
