"""GRPO learns to copy 4 digits from scratch with RL only, within the time bar, on a 2-core CPU."""
import pytest
import torch

from rlfarm.algos.grpo_trainer import GRPOConfig, train_grpo

TIME_BAR_S = 300.0


@pytest.mark.slow
def test_grpo_learns_to_copy_four_digits():
    threads = torch.get_num_threads()
    try:
        summary = train_grpo(GRPOConfig(task="copy", num_digits=4, group_size=8, num_threads=1,
                                        target_reward=0.95, time_limit_s=TIME_BAR_S))
    finally:
        torch.set_num_threads(threads)
    history = summary["history"]
    print("reward by update:", {m["update"]: round(m["reward"], 3) for m in history[::10]},
          "seconds to target:", summary["seconds_to_target"])
    assert history[0]["reward"] < 0.2  # starts near chance
    assert summary["final_reward"] >= 0.95
    assert summary["seconds_to_target"] is not None and summary["seconds_to_target"] <= TIME_BAR_S
