"""An actor-learner's data-parallel ranks share one checkpoint file (no Ray, no process group: the file's layout and
each rank's restore): rank 0 writes the shared weights with every other rank's counters (`save_part`, handed over by
the driver's learner group), and each rank loads the weights with its own counters."""
import torch
from omegaconf import OmegaConf
from test_actor_learner import ENVS, STEPS, cartpole, labeled_chunk  # noqa: F401 - cartpole is a fixture

from helpers import RecordingRunner
from rlfarm.roles.actor_learner import ActorLearner

SPACES = {"obs_dim": 4, "act_dim": 2, "action_low": None, "action_high": None}


def rank(cfg, index: int) -> ActorLearner:
    algo = OmegaConf.to_container(OmegaConf.merge(cfg.algo, {"batch_chunks": 1}), resolve=True)
    learner = ActorLearner(algo, OmegaConf.to_container(cfg.model, resolve=True), SPACES, 0, rank=index, world_size=2)
    learner.set_runners([RecordingRunner()])
    return learner


def test_rank_zero_writes_the_other_ranks_counters_and_each_rank_loads_its_own(cartpole, tmp_path):  # noqa: F811
    cfg, runner = cartpole
    lead, other = rank(cfg, 0), rank(cfg, 1)
    lead._store([labeled_chunk(runner, 0, 1)])
    other._store([labeled_chunk(runner, 1, 1), labeled_chunk(runner, 2, 1)])
    lead._update(1)
    path = lead.save(str(tmp_path / "r.pt"), {"updates": 1}, other.save_part())
    state = torch.load(path, weights_only=True)
    assert [part["stored"] for part in state["ranks"]] == [2 * STEPS * ENVS]
    resumed = [rank(cfg, 0), rank(cfg, 1)]
    assert [r.load(path) for r in resumed] == [{"updates": 1}, {"updates": 1}]
    assert [(r.stored, r.stored_ids) for r in resumed] == [(STEPS * ENVS, {(0, 0)}),
                                                           (2 * STEPS * ENVS, {(0, 1), (0, 2)})]
    for learner in resumed:  # the one policy: rank 0's weights
        for name, tensor in lead.agent.actor.state_dict().items():
            torch.testing.assert_close(learner.agent.actor.state_dict()[name], tensor)
