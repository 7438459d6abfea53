import pytest
import torch


@pytest.fixture
def wrapped_policy(tmp_path):
    """A one-rank gloo group for the test's length, and a factory `make(config, wrapper)` → (a plain policy, a copy
    of it that recomputes its blocks, that copy under DDP or FSDP): the wrappers' code paths, not their
    communication."""
    import torch.distributed as dist

    from rlfarm.data_parallel import shard_model, wrap_data_parallel
    from rlfarm.models.lm import causal_lm

    def make(config: dict, wrapper: str):
        torch.manual_seed(0)
        plain = causal_lm(config).train()
        model = causal_lm(config, recompute=True)
        model.load_state_dict(plain.state_dict())
        return plain, model, (shard_model(model) if wrapper == "fsdp" else wrap_data_parallel(model, "cpu")).train()

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        yield make
    finally:
        dist.destroy_process_group()
