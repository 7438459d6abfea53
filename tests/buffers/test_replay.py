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


def env_rows(start, n):
    """Fields as envs and the object store hand them over: float64 observations, bool flags, read-only."""
    fields = {"obs": np.arange(start, start + n, dtype=np.float64)[:, None] * [1.0, -1.0],
              "terminated": np.arange(start, start + n) % 3 == 0}
    for value in fields.values():
        value.flags.writeable = False
    return fields


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_storage_converts_to_its_dtype_as_it_writes_across_the_ring_end(device, recwarn):
    s = TensorStorage(5, device, dtype=torch.float32)
    s.extend(env_rows(0, 3))
    s.extend(env_rows(3, 4))  # 3, 4 at the end of the ring; 5, 6 over 0, 1 at its start
    assert all(field.dtype == torch.float32 for field in s.fields.values())
    assert s.fields["obs"][:, 0].tolist() == [5, 6, 2, 3, 4] and s.fields["obs"][:, 1].tolist() == [-5, -6, -2, -3, -4]
    assert s.fields["terminated"].tolist() == [0, 1, 0, 1, 0]
    assert not [w for w in recwarn if "writable" in str(w.message)]  # read-only input is only read


def test_storage_state_dict_is_a_copy_that_later_writes_leave_alone():
    s = TensorStorage(4, dtype=torch.float32)
    s.extend(env_rows(0, 2))
    state = s.state_dict()
    s.extend(env_rows(10, 4))
    assert state["fields"]["obs"][:, 0].tolist() == [0, 1] and state["size"] == 2


def test_storage_without_dtype_keeps_the_batch_dtypes():
    s = TensorStorage(4)
    s.extend({"x": np.zeros((2, 3), np.float64), "i": np.ones(2, np.int64)})
    assert s.fields["x"].dtype == torch.float64 and s.fields["i"].dtype == torch.int64
