"""Getting a labeler's bus onto the device: sub-batches across chunks, and StagedUpload (pinned buffers, copy stream)."""
import numpy as np
import pytest
import torch

from rlfarm.rewards.staging import StagedUpload, as_parts, sub_batches


def test_sub_batches_cut_across_chunks_without_copying():
    chunks = [np.arange(5), np.arange(5, 7), np.arange(7, 12)]
    runs = list(sub_batches(chunks, 4))
    assert [np.concatenate(run).tolist() for run in runs] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert all(any(np.shares_memory(piece, chunk) for chunk in chunks) for run in runs for piece in run)  # views
    assert [len(run) for run in runs] == [1, 3, 1]  # the second run spans three chunks
    assert [np.concatenate(run).tolist() for run in sub_batches([np.arange(3)], 8)] == [[0, 1, 2]]
    assert as_parts(np.zeros(2)).__len__() == 1 and len(as_parts([np.zeros(2), np.zeros(3)])) == 2


def test_cpu_upload_is_a_writable_copy_of_read_only_chunks():
    chunk = np.arange(6, dtype=np.float32)
    chunk.flags.writeable = False  # as a chunk read from the object store
    rows = StagedUpload(torch.device("cpu"), 8)([chunk[:2], chunk[4:]], "x", 0)
    assert rows.tolist() == [0.0, 1.0, 4.0, 5.0]
    rows.add_(1)  # its own memory
    assert chunk.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.gpu
def test_cuda_upload_through_two_buffers_and_a_copy_stream_keeps_every_row():
    upload = StagedUpload(torch.device("cuda:0"), 64)
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 256, size=(n, 8, 8, 3), dtype=np.uint8) for n in (30, 50, 70, 10)]
    expected = np.concatenate(chunks)
    uploaded = [upload(run, "frames", index % 2).float().sum(dim=(1, 2, 3))  # queued work reading each upload
                for index, run in enumerate(sub_batches(chunks, 64))]
    torch.testing.assert_close(torch.cat(uploaded).cpu(), torch.from_numpy(expected).float().sum(dim=(1, 2, 3)))
    rewards = np.linspace(-1, 1, 40)  # another name and dtype: buffers of its own
    assert upload([rewards], "env_reward", 0).cpu().numpy().tolist() == rewards.tolist()
