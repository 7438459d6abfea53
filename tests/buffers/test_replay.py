import numpy as np
import pytest
import torch

from rlfarm.buffers.replay import ReplayBuffer
from rlfarm.buffers.sampler import UniformSampler
from rlfarm.buffers.storage import TensorStorage


def rows(start, n):
    return {"x": np.arange(start, start + n, dtype=np.float32)[:, None], "t": np.zeros(n, dtype=np.float32)}


def test_ring_buffer_overwrites_oldest():
    s = TensorStorage(5)
    s.extend(rows(0, 3))
    s.extend(rows(3, 4))  # wraps: 5, 6 overwrite 0, 1
    assert len(s) == 5 and s.cursor == 2
    assert sorted(s.fields["x"][:, 0].tolist()) == [2, 3, 4, 5, 6]


def test_batch_larger_than_capacity_keeps_newest():
    s = TensorStorage(3)
    s.extend(rows(0, 10))
    assert sorted(s.fields["x"][:, 0].tolist()) == [7, 8, 9]


def test_sampler_only_draws_filled_rows_and_is_seeded():
    buf = ReplayBuffer(TensorStorage(100), UniformSampler(64, generator_seed=3))
    buf.extend(rows(0, 10))
    a = buf.sample()["x"]
    assert a.shape == (64, 1) and a.max() < 10
    buf2 = ReplayBuffer(TensorStorage(100), UniformSampler(64, generator_seed=3))
    buf2.extend(rows(0, 10))
    assert torch.equal(a, buf2.sample()["x"])


def test_state_dict_round_trip():
    buf = ReplayBuffer(TensorStorage(8), UniformSampler(4, generator_seed=0))
    buf.extend(rows(0, 11))
    restored = ReplayBuffer(TensorStorage(8), UniformSampler(4))
    restored.load_state_dict(buf.state_dict())
    assert len(restored) == 8 and restored.storage.cursor == buf.storage.cursor
    assert torch.equal(restored.storage.fields["x"], buf.storage.fields["x"])
    assert torch.equal(restored.sample()["x"], buf.sample()["x"])


def test_empty_sample_raises():
    with pytest.raises(RuntimeError):
        ReplayBuffer(TensorStorage(4), UniformSampler(2)).sample()


def test_sample_into_fills_the_index_from_the_filled_rows_only():
    index = torch.full((4, 256), -1, dtype=torch.long)
    size = torch.tensor(10.0, dtype=torch.float64)  # a tensor, so a captured graph follows the buffer's growth
    assert UniformSampler(256).sample_into(index, size) is index
    assert index.min() >= 0 and index.max() < 10 and len(index.unique()) == 10
    size.fill_(3.0)
    assert UniformSampler(256).sample_into(index, size).max() < 3
