"""reward=distilled: a teacher labels a seeded random fraction of the frames once a student trained online on its labels
agrees with it; until then every frame is the teacher's. A cheap teacher that is a function of the frames (the mean
brightness: learnable), the tiny random-weight judge through Hydra, teacher failures, and a SAC run with the judge
as teacher through the labeling farm."""
import json

import numpy as np
import pytest
from hydra.utils import instantiate

from helpers import rlfarm
from rlfarm.config import compose
from rlfarm.config.probes import built_reward
from rlfarm.errors import ConfigError
from rlfarm.loops.offpolicy_metrics import reward_model_row
from rlfarm.rewards import ModuleReward, RewardModelError
from rlfarm.rewards.distilled import DistilledReward
from rlfarm.rewards.vlm_factory import save_random_judge

SIDE = 16
SMALL_STUDENT = {"_target_": "rlfarm.rewards.fitted.PixelCNN", "channels": [8, 16], "hidden": 32}


class Brightness(ModuleReward):
    """The mean brightness of each frame (reward=model's example module), with the size of every batch it was given."""

    def __init__(self):
        super().__init__(module={"_target_": "rlfarm.rewards.model.BrightnessReward"}, frame_size=SIDE)
        self.seen: list[int] = []

    def start(self, batch):
        self.seen.append(len(batch["frames"]))
        return super().start(batch)


class Broken(Brightness):
    """A teacher that fails as a model does: raising, or returning NaN."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how

    def __call__(self, batch):
        if self.how == "raise":
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return np.full(len(batch["frames"]), np.nan, np.float32)

    def start(self, batch):
        from rlfarm.rewards.base import Pending

        return Pending(self(batch))


def distilled(teacher=None, **settings) -> DistilledReward:
    settings = {"teacher_fraction": 0.1, "min_teacher_labels": 256, "warm_agreement": 0.9, "agreement_window": 128,
                "student_frame_size": SIDE, "batch_size": 64, "lr": 3e-3} | settings
    model = DistilledReward(teacher if teacher is not None else Brightness(), student=SMALL_STUDENT, **settings)
    model.setup("cpu")
    return model


def scenes(n: int, rng: np.random.Generator, side: int = SIDE) -> np.ndarray:
    """Frames that differ as scenes do: each its own colour and brightness, plus pixel noise."""
    colour = rng.uniform(0, 255, size=(n, 1, 1, 3))
    return np.clip(colour + rng.normal(0, 20, size=(n, side, side, 3)), 0, 255).astype(np.uint8)


def test_the_teacher_labels_everything_until_the_student_is_warm_then_its_fraction(one_torch_thread):
    model, rng = distilled(), np.random.default_rng(0)
    teacher = model.teacher
    calls = 0
    while not model.warm:
        frames = scenes(64, rng)
        rewards = model({"frames": frames})
        calls += 1
        # cold: the agent sees the teacher's reward of every frame, exactly
        assert teacher.seen[-1] == 64 and np.array_equal(rewards, teacher({"frames": frames}))
        assert calls < 40, model.stats()
    stats = model.stats()
    assert stats["distill_teacher_labels"] >= 256 and stats["distill_spearman"] >= 0.9, stats
    assert stats["distill_student_steps"] == 4 * calls and stats["distill_teacher_fraction"] == 1.0

    seen_before, frames_after, errors = sum(teacher.seen), 0, []
    for _ in range(30):
        frames = scenes(64, rng)
        rewards, truth = model({"frames": frames}), teacher({"frames": frames})
        teacher.seen.pop()  # the check's own call
        chosen = np.flatnonzero(rewards == truth)
        assert len(chosen) >= teacher.seen[-1]  # the teacher's frames carry its labels
        errors.append(np.abs(rewards - truth).mean())
        frames_after += 64
    share = (sum(teacher.seen) - seen_before) / frames_after
    assert 0.07 <= share <= 0.13, share  # 0.1 of 1,920 frames, rounded per call at random
    assert model.warm and np.mean(errors) < 0.05, (np.mean(errors), model.stats())  # brightness in [0, 1]
    assert model.stats()["distill_teacher_fraction"] == pytest.approx(share, abs=0.05)


def test_the_choice_is_seeded(one_torch_thread):
    runs = {}
    for seed in (0, 0, 1):
        model, rng = distilled(seed=seed, min_teacher_labels=64, warm_agreement=-1.0), np.random.default_rng(7)
        rewards = [model({"frames": scenes(64, rng)}) for _ in range(4)]
        runs.setdefault(seed, []).append((model.teacher.seen, np.concatenate(rewards)))
    (seen_a, rewards_a), (seen_b, rewards_b) = runs[0]
    assert seen_a == seen_b and np.array_equal(rewards_a, rewards_b)  # same seed, same frames: the same run
    assert seen_a[0] == 64 and sum(seen_a[1:]) < 64  # warm after one call (agreement not required)
    assert runs[1][0][0] != seen_a or not np.array_equal(runs[1][0][1], rewards_a)
    model = distilled(min_teacher_labels=64, warm_agreement=-1.0)
    model({"frames": scenes(64, np.random.default_rng(0))})
    picks = [tuple(model.choose(100)) for _ in range(3)]
    assert len(set(picks)) == 3 and all(8 <= len(p) <= 11 for p in picks)  # fresh at random, ~teacher_fraction


def test_the_choice_does_not_follow_the_student_s_training(one_torch_thread):
    """The labeler starts its next bus before or after the last one trains, as the bus timing falls: the teacher's share
    is drawn from a stream of its own, so the seeded choice is the same either way."""
    picks = []
    for extra_training in (False, True):
        model = distilled(min_teacher_labels=64, warm_agreement=-1.0)
        model({"frames": scenes(64, np.random.default_rng(0))})
        if extra_training:
            model._train(2, 8)
        picks.append(model.choose(100))
    assert np.array_equal(*picks)


def test_a_student_that_returns_nan_goes_cold_and_its_retry_learns_the_call_once(one_torch_thread):
    model, rng = distilled(min_teacher_labels=64, warm_agreement=-1.0), np.random.default_rng(0)
    model({"frames": scenes(64, rng)})
    assert model.warm
    before = model.stats()
    model.student.target_mean.fill_(float("nan"))  # every score NaN
    frames = scenes(64, rng)
    with pytest.raises(FloatingPointError, match="the student returned .* NaN/inf rewards"):
        model({"frames": frames})
    assert not model.warm and model.stats()["distill_teacher_labels"] == before["distill_teacher_labels"]
    rewards = model({"frames": frames})  # the labeler's retry: every frame the teacher's, learned once
    assert np.array_equal(rewards, model.teacher({"frames": frames}))
    after = model.stats()
    assert after["distill_frames"] - before["distill_frames"] == 64
    assert after["distill_teacher_labels"] - before["distill_teacher_labels"] == 64 and model._replay.size == 128


def test_a_student_that_cannot_learn_still_returns_the_whole_call_once_and_goes_cold(one_torch_thread, monkeypatch):
    """Training that raises (an OOM on a shared GPU) comes after the rewards are whole: the call returns them (the
    labeler has nothing to retry, so nothing is learned or counted twice), and the student is cold until it agrees."""
    model, rng = distilled(min_teacher_labels=64, warm_agreement=-1.0), np.random.default_rng(0)
    model({"frames": scenes(64, rng)})
    assert model.warm
    before = model.stats()

    def out_of_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory (a stand-in)")

    monkeypatch.setattr(model, "_train", out_of_memory)
    frames = scenes(64, rng)
    rewards = model({"frames": frames})
    assert rewards.shape == (64,) and np.isfinite(rewards).all()
    after = model.stats()
    assert not model.warm and after["distill_learn_errors"] == 1
    assert after["distill_frames"] - before["distill_frames"] == 64  # the call counted once


@pytest.mark.parametrize("how, error", [("raise", RuntimeError), ("nan", FloatingPointError)])
def test_a_failing_teacher_fails_the_call_and_teaches_nothing(one_torch_thread, how, error):
    model = distilled(Broken(how))
    with pytest.raises(error):
        model({"frames": scenes(8, np.random.default_rng(0))})
    assert model.stats()["distill_teacher_labels"] == 0 and model.stats()["distill_student_steps"] == 0


@pytest.mark.parametrize("settings, message", [
    ({"teacher_fraction": 1.5}, "reward.teacher_fraction must be in (0, 1], got 1.5; set reward.teacher_fraction"),
    ({"teacher_fraction": 0.0}, "reward.teacher_fraction must be in (0, 1], got 0.0"),
    ({"warm_agreement": 2}, "reward.warm_agreement must be in [-1, 1], got 2"),
    ({"min_teacher_labels": 1}, "reward.min_teacher_labels must be >= 2, got 1"),
])
def test_settings_out_of_range_are_one_line_errors(settings, message):
    with pytest.raises(RewardModelError) as raised:
        DistilledReward(Brightness(), **settings)
    assert message in str(raised.value) and "\n" not in str(raised.value)


@pytest.fixture(scope="module")
def tiny_judge(tmp_path_factory) -> str:
    return str(save_random_judge(tmp_path_factory.mktemp("tiny_judge"), "tiny_shape"))


def test_the_tiny_judge_teaches_through_the_composed_config(tiny_judge, one_torch_thread):
    cfg = compose("train", ["algo=sac", "reward=distilled", f"reward.teacher.model={tiny_judge}",
                            "reward.teacher.frame_size=32", "reward.student_frame_size=16", "reward.min_teacher_labels=16",
                            "reward.warm_agreement=-1", "reward.teacher_fraction=0.25"])
    model = instantiate(cfg.reward)
    assert (model.needs, model.frame_size, model.settings.seed) == (("frames",), 32, cfg.seed)
    model.setup("cpu")
    rng = np.random.default_rng(0)
    cold = scenes(16, rng, 32)
    np.testing.assert_allclose(model({"frames": cold}), model.teacher({"frames": cold}), rtol=1e-5, atol=1e-5)
    warm = scenes(16, rng, 32)
    rewards = model({"frames": warm})
    assert model.warm and rewards.shape == (16,) and rewards.dtype == np.float32 and np.isfinite(rewards).all()
    assert 2 <= model.stats()["distill_teacher_fraction"] * 32 - 16 <= 6  # 16 cold frames, then 4 of 16
    bad = compose("train", ["reward=distilled", "reward.teacher.model=tiny_shape", "reward.teacher.score=logit"])
    with pytest.raises(ConfigError) as raised:  # as preflight builds it: the teacher's own error, under reward.teacher
        built_reward(bad)
    assert (raised.value.problem, raised.value.fix) == ("reward.teacher.score='logit' is not a judge score",
                                                        "set reward.teacher.score=log_odds or p_yes")


def test_reward_model_stats_across_labelers():
    labelers = [{"reward_model": {"distill_warm": True, "distill_frames": 10, "distill_spearman": 0.9}},
                {"reward_model": {"distill_warm": False, "distill_frames": 5, "distill_spearman": None}},
                {}]  # a labeler restarting
    assert reward_model_row(labelers) == {"distill_warm": False, "distill_frames": 15, "distill_spearman": 0.9}
    assert reward_model_row([{}]) == {}


@pytest.mark.slow  # a SAC run through Ray with the judge and a student in the labeler
def test_sac_with_a_distilled_judge_labels_every_transition(tmp_path, tiny_judge):
    run_dir = tmp_path / "run"
    out = rlfarm("train", f"hydra.run.dir={run_dir}", "algo=sac", "env=halfcheetah", "reward=distilled",
                 f"reward.teacher.model={tiny_judge}", "reward.teacher.frame_size=32", "reward.student_frame_size=16",
                 "reward.min_teacher_labels=64", "reward.warm_agreement=-1", "reward.teacher_fraction=0.25",
                 "reward.student.channels=[8,16]", "reward.student.hidden=32", "labeler.bus_items=32",
                 "total_env_steps=256", "algo.learning_starts=64", "algo.batch_size=32", "algo.chunk_steps=32",
                 "model.actor.hidden=[32,32]", "model.critic.hidden=[32,32]", "run.live=false", "logger=none")
    assert out.returncode == 0, out.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transitions_produced"] == summary["transitions_labeled"] == summary["transitions_stored"] == 256
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["distill_frames"] == 256 and last["distill_warm"] is True, last
    assert 64 <= last["distill_teacher_labels"] < 256 and last["distill_student_steps"] > 0, last
    assert last["distill_spearman"] is not None and 0 < last["distill_teacher_fraction"] <= 1, last


@pytest.mark.gpu
def test_the_student_learns_and_labels_on_cuda():
    """The student, its replay and its training on the labeler's GPU (bf16 autocast, as rlfarm fit-reward trains there);
    rewards come back to the host as numpy."""
    teacher = Brightness()
    model = DistilledReward(teacher, student=SMALL_STUDENT, teacher_fraction=0.1, min_teacher_labels=256,
                            warm_agreement=0.9, agreement_window=128, student_frame_size=SIDE, batch_size=64, lr=3e-3)
    model.setup("cuda:0")
    rng = np.random.default_rng(0)
    for _ in range(40):
        frames = scenes(64, rng)
        first, second = model.start({"frames": frames}), model.start({"frames": scenes(64, rng)})  # two in flight
        rewards = first.result()
        second.result()
        assert rewards.dtype == np.float32 and rewards.shape == (64,)
    assert model.warm and model.student.target_mean.is_cuda, model.stats()
    frames = scenes(64, rng)
    assert np.abs(model({"frames": frames}) - teacher({"frames": frames})).mean() < 0.1


def test_each_labeler_seeds_its_reward_model_apart():
    """Two labelers of one run must not pick the same frames of every bus, nor start the same student."""
    from rlfarm.roles.labeler import _own_seed

    assert _own_seed({"seed": 7, "teacher_fraction": 0.1}, 2) == {"seed": 9, "teacher_fraction": 0.1}
    assert _own_seed({"model": "x"}, 2) == {"model": "x"} and _own_seed({"seed": None}, 1) == {"seed": None}
