"""The env chunk record: its fields named once, the lists of who sends what read off it."""
import dataclasses

from rlfarm import chunk
from rlfarm.envs.step_buffers import StepBuffers


def test_the_field_lists_come_from_the_record():
    assert chunk.STEPPED == ("obs", "action", "next_obs", "env_reward", "terminated", "truncated")
    assert chunk.RECORDED == (*chunk.STEPPED, "frames")
    assert chunk.LEARNED == (*chunk.STEPPED, "logprob", "sampled_action", "reward")  # no frames for a learner
    assert set(chunk.fields(chunk.STEP, chunk.FRAME, chunk.BEHAVIOUR, chunk.LABEL)) == set(chunk.Chunk.__annotations__)


def test_a_vector_env_writes_the_recorded_fields():
    arrays = tuple(f.name for f in dataclasses.fields(StepBuffers) if f.name != "key")
    assert arrays == chunk.RECORDED
