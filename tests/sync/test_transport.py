"""The transport is picked once, from `algo.weight_sync` and where the roles run; each side's end is built from it."""
import pytest
import torch

from rlfarm.errors import ConfigError
from rlfarm.sync import HostSender, PassThroughReceiver, open_receiver, open_sender, pick_transport


@pytest.mark.parametrize("on_gpus,time_share,expected", [(False, False, "object_store"), (True, False, "broadcast"),
                                                         (True, True, "ipc"), (False, True, "object_store")])
def test_auto_picks_by_where_the_roles_run(on_gpus, time_share, expected):
    assert pick_transport("auto", on_gpus, time_share) == expected


def test_a_named_transport_is_kept_and_ipc_needs_one_shared_gpu():
    assert pick_transport("object_store", True, True) == "object_store"
    assert pick_transport("broadcast", False, False) == "broadcast"  # gloo between CPU roles
    assert pick_transport("ipc", True, True) == "ipc"
    for on_gpus, time_share in ((True, False), (False, True)):
        with pytest.raises(ConfigError, match="needs the learner and the engine on one GPU"):
            pick_transport("ipc", on_gpus, time_share)
    with pytest.raises(ConfigError, match="must be one of"):
        pick_transport("nccl", True, False)


def test_the_object_store_ends_hand_over_host_copies():
    state = {"w": torch.ones(2, requires_grad=True)}
    sender, receiver = open_sender("object_store", state, "cpu"), open_receiver("object_store", "cpu")
    assert isinstance(sender, HostSender) and isinstance(receiver, PassThroughReceiver)
    (part,) = receiver.receive(sender.send(state))
    assert torch.equal(part["w"], state["w"]) and part["w"].data_ptr() != state["w"].data_ptr()
