"""reward=distilled: a slow teacher (the VLM judge by default) labels a random `teacher_fraction` of each call's
frames; a small student network, trained online on the teacher's labels in the labeler process, labels the rest.

Why: a ~2B judge labels a few hundred frames/s per GPU while the envs produce thousands of steps/s, so the farm
throttles the run (the runners wait for credits). A student that follows the judge costs a small conv net's forward
per frame, and the judge's share of the frames shrinks to `teacher_fraction`.

Per call (one labeler bus):
1. While the student is cold every frame goes to the teacher; once warm a seeded random `teacher_fraction` of them
   (the count rounded stochastically, so it is `teacher_fraction` on average at any bus size).
2. The student scores every frame of the call *before* it trains on any of them. Its scores of the teacher's frames,
   which it has never seen, are the held-out agreement (prequential: every teacher-labeled frame is held out when it
   is scored); Spearman's rank correlation and the mean absolute error over the last `agreement_window` of them.
3. The teacher's labels go into a bounded replay (the frames at the student's size, on the labeler's device) and the
   student takes `train_steps` minibatch steps on it, on targets standardized by the replay's mean and std as
   `rlfarm fit-reward` trains (`descend` of rlfarm/rewards/fit_steps.py; the networks of rlfarm/rewards/fitted.py).
4. The agent gets the teacher's label where there is one, the student's score elsewhere.

The student is warm while it has seen `min_teacher_labels` teacher labels and its agreement is at least
`warm_agreement`; when the agreement drops below it again (the policy moved to frames the student has not learned),
every frame goes back to the teacher until it recovers, so the agent never trains on a student that does not follow
the teacher. A teacher that raises, or returns the wrong count or NaN/inf, raises here too, before the student learns
anything of that call: the labeler retries the bus and quarantines what fails again. So does a student whose scores of
the frames it labels are NaN/inf, after going cold: the retry is the teacher's, and the call's labels are learned once.

On CUDA the teacher's and the student's work are queued as `start` returns (the labeler prepares its next bus
meanwhile); `result` waits for the teacher's labels and queues the student's training steps behind them.
"""
from __future__ import annotations

import inspect
import logging
import math
import re
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from rlfarm.rewards.fit_steps import descend, held_out_metrics
from rlfarm.rewards.base import OnDevice, Pending, RewardModel, RewardModelError
from rlfarm.rewards.fitted import FittedReward
from rlfarm.settings import RangeError, check_ranges

log = logging.getLogger("rlfarm")

DEFAULT_STUDENT = {"_target_": "rlfarm.rewards.fitted.PixelCNN"}
RECENT_CALLS = 16  # calls the reported teacher fraction and reward means are taken over


@dataclass(frozen=True)
class DistillSettings:
    """DistilledReward's settings (defaults there), checked against rlfarm/settings.py RANGES as they are built;
    conf/reward/distilled.yaml says what each does."""

    teacher_fraction: float
    min_teacher_labels: int
    warm_agreement: float
    agreement_window: int
    replay_frames: int
    train_steps: int
    batch_size: int
    lr: float
    weight_decay: float
    student_frame_size: int
    max_batch: int
    seed: int

    def __post_init__(self) -> None:
        check_ranges(self)


class DistilledReward(RewardModel):
    """A teacher reward model labels a fraction of the frames; a student network fitted to it online, the rest.

    teacher: a reward config (a `_target_` node, built here: constructors load no weights) or a RewardModel.
    student: a `FittedReward` node (PixelCNN by default), built in `setup` on the labeler's device; its `frame_size`
        and `frame_stack` are filled in (student_frame_size, the teacher's stack) where it takes them.
    The other arguments: `DistillSettings`.
    """

    takes_parts = ()  # the teacher's share is picked out of the whole bus

    def __init__(self, teacher, student: dict | None = None, teacher_fraction: float = 0.1, min_teacher_labels: int = 512,
                 warm_agreement: float = 0.8, agreement_window: int = 512, replay_frames: int = 8192,
                 train_steps: int = 4, batch_size: int = 128, lr: float = 1e-3, weight_decay: float = 0.0,
                 student_frame_size: int = 64, max_batch: int = 512, seed: int = 0):
        # spelled out, not **settings: the config's key check (rlfarm/config/known_keys.py) reads this signature
        try:
            self.settings = DistillSettings(
                teacher_fraction, min_teacher_labels, warm_agreement, agreement_window, replay_frames, train_steps,
                batch_size, lr, weight_decay, student_frame_size, max_batch, seed)
        except RangeError as error:
            raise RewardModelError(f"reward.{error}; set reward.{error.key} to a value {error.allowed}") from None
        self.teacher = teacher if isinstance(teacher, RewardModel) else _built_teacher(teacher)
        self.student_node = _plain(student) if student else dict(DEFAULT_STUDENT)
        teacher_needs = tuple(self.teacher.needs)
        self.needs = teacher_needs + (() if "frames" in teacher_needs else ("frames",))
        self.frame_size = self.teacher.frame_size or self.settings.student_frame_size
        self.frame_stack = int(getattr(self.teacher, "frame_stack", 1))
        self.student: FittedReward | None = None
        self.warm = False
        self.frames = self.teacher_labels = self.student_steps = self.learn_errors = 0
        self._summary: dict = {}  # replaced whole by the labeling thread; `stats` reads it from another thread

    def setup(self, device: str) -> None:
        s = self.settings
        self._device = torch.device(device)
        self.teacher.stages = self.stages  # the labeler's stage clock times the teacher's own uploads
        with _under_teacher():
            self.teacher.setup(device)
        with torch.random.fork_rng(devices=[]):  # the student's initial weights follow `seed`, nothing else's
            torch.manual_seed(s.seed)
            self.student = _built_student(self.student_node, s.student_frame_size, self.frame_stack)
        self.student.to(self._device).train()
        trained = [p for p in self.student.parameters() if p.requires_grad]
        self._optimizer = torch.optim.AdamW(trained, lr=s.lr, weight_decay=s.weight_decay)
        # the teacher's share and the student's minibatches in streams of their own: which of `start` (the next bus)
        # and `result` (the last one's training) draws first depends on the bus timing, and must not move the choice
        self._rng, self._train_rng = (np.random.default_rng(seq) for seq in np.random.SeedSequence(s.seed).spawn(2))
        self._replay = Replay(s.replay_frames, self._device)
        self._agreement = Window(s.agreement_window)
        self._recent: deque = deque(maxlen=RECENT_CALLS)  # per call: (frames, teacher frames, teacher sum, student sum)
        self._agreement_now = self._agreement.metrics()

    def __call__(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        return self.start(batch).result()

    def start(self, batch: dict[str, np.ndarray]) -> Pending:
        if self.student is None:
            raise RewardModelError("DistilledReward.setup(device) must run before labeling")
        n = len(batch["frames"])
        chosen = self.choose(n)
        everything = len(chosen) == n  # cold: the bus as it came, no copy
        teacher_batch = {key: batch[key] if everything else np.asarray(batch[key])[chosen] for key in self.teacher.needs}
        teacher_call = self.teacher.start(teacher_batch) if len(chosen) else Pending(np.zeros(0, np.float32))
        frames = self._student_frames(np.asarray(batch["frames"]))
        with torch.no_grad(), self._autocast():  # scored before it learns this call's labels: honest agreement
            scores = torch.cat([self.student(part).float() for part in frames.split(self.settings.max_batch)])
        scored = OnDevice(scores) if scores.is_cuda else Pending(scores.numpy())
        return _Distilling(self, chosen, teacher_call, frames, scored)

    def choose(self, n: int) -> np.ndarray:
        """Sorted indices of the frames the teacher labels: all while the student is cold, else a seeded random
        `teacher_fraction` of them (their count rounded up or down at random, so the share holds at any n)."""
        if not self.warm:
            return np.arange(n)
        count = min(n, math.floor(self.settings.teacher_fraction * n + self._rng.random()))
        return np.sort(self._rng.choice(n, size=count, replace=False))

    def stats(self) -> dict:
        """This labeler's student since it started (a restarted labeler counts from 0 again, with a new student)."""
        return {"distill_warm": self.warm, "distill_frames": self.frames, "distill_teacher_labels": self.teacher_labels,
                "distill_student_steps": self.student_steps, "distill_learn_errors": self.learn_errors, **self._summary}

    def learn(self, frames: torch.Tensor, labels: np.ndarray, predicted: np.ndarray) -> None:
        """The teacher's labels of `frames` (student-sized, on the device): score the student's earlier guesses,
        keep them in the replay, train the student on it and decide whether it is warm."""
        s = self.settings
        if len(labels):
            self._agreement.add(predicted, labels)
            self._replay.add(frames, labels)
            self.teacher_labels += len(labels)
        if self._replay.size >= 2 and s.train_steps:
            self._train(s.train_steps, min(s.batch_size, self._replay.size))
        agreement = self._agreement.metrics()
        self.warm = self.teacher_labels >= s.min_teacher_labels and agreement["spearman"] >= s.warm_agreement
        self._agreement_now = agreement

    def _train(self, steps: int, batch_size: int) -> None:
        labels = self._replay.host_labels()
        mean, std = float(labels.mean()), float(labels.std())
        self.student.set_target_stats(mean, std)
        for _ in range(steps):
            index = torch.from_numpy(self._train_rng.integers(0, len(labels), batch_size)).to(self._device)
            frames, targets = self._replay.frames[index], (self._replay.labels[index] - mean) / max(std, 1e-6)
            with self._autocast():
                scores = self.student.head(self.student.features(frames)).float()
            descend(self._optimizer, scores, targets)
        self.student_steps += steps

    def finished(self, n: int, chosen: np.ndarray, labels: np.ndarray, rewards: np.ndarray) -> None:
        """Counters and the reported summary after a call of `n` frames, `chosen` of them the teacher's."""
        self.frames += n
        rest = np.ones(n, bool)
        rest[chosen] = False
        self._recent.append((n, len(chosen), float(labels.sum()), float(rewards[rest].sum())))
        frames, teacher, teacher_sum, student_sum = (sum(call[i] for call in self._recent) for i in range(4))
        agreement = self._agreement_now
        self._summary = {
            "distill_teacher_fraction": teacher / max(frames, 1),
            "distill_spearman": _finite(agreement.get("spearman")), "distill_mae": _finite(agreement.get("mae")),
            "distill_agreement_frames": agreement.get("frames", 0),
            "distill_teacher_reward_mean": teacher_sum / teacher if teacher else None,
            "distill_student_reward_mean": student_sum / (frames - teacher) if frames > teacher else None}

    def _student_frames(self, frames: np.ndarray) -> torch.Tensor:
        """[n, S, S, 3k] uint8 → [n, s, s, 3k] uint8 on the device at the student's side s (antialiased resize)."""
        side, out = self.settings.student_frame_size, []
        for start in range(0, len(frames), self.settings.max_batch):
            piece = torch.from_numpy(np.ascontiguousarray(frames[start:start + self.settings.max_batch]))
            piece = piece.to(self._device)
            if piece.shape[1:3] != (side, side):
                pixels = F.interpolate(piece.permute(0, 3, 1, 2).float(), size=(side, side), mode="bilinear",
                                       antialias=True, align_corners=False)
                piece = pixels.round_().clamp_(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
            out.append(piece)
        return torch.cat(out) if out else torch.empty((0, side, side, 3 * self.frame_stack), dtype=torch.uint8,
                                                      device=self._device)

    def _autocast(self):
        return torch.autocast(self._device.type, dtype=torch.bfloat16, enabled=self._device.type == "cuda")


class _Distilling(Pending):
    """A distilled call under way: ready when the teacher's labels and the student's scores are; `result` checks the
    teacher's labels (raising as the teacher failed), lets the student learn them and joins the two."""

    def __init__(self, model: DistilledReward, chosen: np.ndarray, teacher_call: Pending, frames: torch.Tensor,
                 scored: Pending):
        self.model, self.chosen, self.teacher_call, self.frames, self.scored = model, chosen, teacher_call, frames, scored

    def ready(self) -> bool:
        return self.teacher_call.ready() and self.scored.ready()

    def result(self) -> np.ndarray:
        labels = np.asarray(self.teacher_call.result(), dtype=np.float32).reshape(-1)
        if labels.shape[0] != len(self.chosen):
            raise RewardModelError(f"the teacher returned {labels.shape[0]} rewards for {len(self.chosen)} frames")
        if not np.isfinite(labels).all():
            raise FloatingPointError(f"the teacher returned {int((~np.isfinite(labels)).sum())} NaN/inf rewards")
        rewards = np.array(self.scored.result(), dtype=np.float32)
        students = np.ones(len(rewards), bool)
        students[self.chosen] = False
        if not np.isfinite(rewards[students]).all():  # before learning: the labeler's retry must not learn it twice
            self.model.warm = False  # the retry (and every call until it agrees again) is the teacher's
            raise FloatingPointError(f"the student returned {int((~np.isfinite(rewards[students])).sum())} NaN/inf "
                                     "rewards; it is cold again")
        chosen = torch.from_numpy(self.chosen).to(self.frames.device)
        try:
            self.model.learn(self.frames[chosen], labels, rewards[self.chosen])
        except Exception as error:  # the rewards are whole: a student that failed to learn (an OOM on a shared GPU)
            # must not fail the call, whose retry would learn and count these labels again; it is cold until it agrees
            self.model.warm = False
            self.model.learn_errors += 1
            log.warning("distilled reward: the student could not learn this bus (%s: %s); it is cold until it agrees "
                        "again", type(error).__name__, str(error).strip().splitlines()[0] if str(error).strip() else "")
        rewards[self.chosen] = labels
        self.model.finished(len(rewards), self.chosen, labels, rewards)
        return rewards


class Ring:
    """Slots of the newest `capacity` items: where the next m go (the oldest overwritten first) and how many are held."""

    def __init__(self, capacity: int):
        self.capacity, self.size, self._next = capacity, 0, 0

    def slots(self, m: int) -> np.ndarray:
        taken = (self._next + np.arange(m)) % self.capacity
        self._next = int((self._next + m) % self.capacity)
        self.size = min(self.size + m, self.capacity)
        return taken


class Replay(Ring):
    """The newest `capacity` (frame, teacher label) pairs: frames [m, s, s, 3k] uint8 and labels [m] on the device
    (allocated at the first add, when the frames' shape is known), the labels also on the host (their statistics)."""

    def __init__(self, capacity: int, device: torch.device):
        super().__init__(capacity)
        self.device, self.frames, self.labels = device, None, None
        self._host = np.zeros(capacity, np.float32)

    def add(self, frames: torch.Tensor, labels: np.ndarray) -> None:
        frames, labels = frames[-self.capacity:], labels[-self.capacity:]
        if self.frames is None:
            self.frames = torch.empty((self.capacity, *frames.shape[1:]), dtype=frames.dtype, device=self.device)
            self.labels = torch.empty(self.capacity, dtype=torch.float32, device=self.device)
        slots = self.slots(len(labels))
        index = torch.from_numpy(slots).to(self.device)
        self.frames[index] = frames
        self.labels[index] = torch.from_numpy(labels).to(self.device)
        self._host[slots] = labels

    def host_labels(self) -> np.ndarray:
        return self._host[:self.size]


class Window(Ring):
    """The newest `capacity` (student score, teacher label) pairs of frames the student had not trained on."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.predicted, self.true = np.zeros(capacity), np.zeros(capacity)

    def add(self, predicted: np.ndarray, true: np.ndarray) -> None:
        predicted, true = predicted[-self.capacity:], true[-self.capacity:]
        slots = self.slots(len(true))
        self.predicted[slots], self.true[slots] = predicted, true

    def metrics(self) -> dict:
        """held_out_metrics of the window (Spearman NaN while under 2 pairs or either side is constant)."""
        if self.size < 2:
            return {"frames": self.size, "spearman": float("nan"), "mae": float("nan")}
        return held_out_metrics(self.predicted[:self.size], self.true[:self.size])


def _built_teacher(node) -> RewardModel:
    with _under_teacher():
        return instantiate(node)


@contextmanager
def _under_teacher():
    """The teacher's one-line errors (RewardModelError, also inside Hydra's InstantiationException) with its keys
    named where they are set: reward.score → reward.teacher.score."""
    try:
        yield
    except Exception as error:
        cause = error
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, RewardModelError):
            raise RewardModelError(re.sub(r"\breward([.=])", r"reward.teacher\1", str(cause))) from None
        raise


def _built_student(node: dict, frame_size: int, frame_stack: int) -> FittedReward:
    """The student network; frame_size and frame_stack given where its class takes them (a frozen-tower head does not):
    the frames it gets are resized to reward.student_frame_size and stacked as the teacher's."""
    parameters = inspect.signature(get_object(node["_target_"])).parameters
    extra = {key: value for key, value in (("frame_size", frame_size), ("frame_stack", frame_stack)) if key in parameters}
    net = instantiate(node, **extra)
    if not isinstance(net, FittedReward):
        raise RewardModelError(f"reward.student._target_={node['_target_']} is not a FittedReward; set it to "
                               "rlfarm.rewards.fitted.PixelCNN or another network of rlfarm/rewards/fitted.py")
    return net


def _plain(node) -> dict:
    """A plain dict pickles small and free of the parent config when Ray ships the model to the labelers."""
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node)


def _finite(value) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
