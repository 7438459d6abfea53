"""Engine tests run their tiny models on one thread: the CI machine's few cores are shared, and a thread pool
per test process would oversubscribe them."""
import pytest
import torch


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
