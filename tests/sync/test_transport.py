"""The transport is picked once, from `algo.weight_sync` and where the roles run; each side's end is built from it."""
import pytest
import torch

from rlfarm.errors import ConfigError
import threading

from rlfarm.sync import (BroadcastReceiver, HeldWeights, HostSender, ObjectStoreReceiver, ObjectStoreSender,
                         SenderSetup, open_receiver, open_sender, pick_transport)


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
    assert isinstance(sender, ObjectStoreSender) and isinstance(receiver, ObjectStoreReceiver)
    sent, version = sender.publish(state)
    (part,) = receiver.receive(sent)
    assert version == 1 and sender.publish(state)[1] == 2  # the sender counts the versions
    assert torch.equal(part["w"], state["w"]) and part["w"].data_ptr() != state["w"].data_ptr()
    (plain,) = receiver.receive(HostSender().send(state))  # host copies handed over as they are
    assert torch.equal(plain["w"], state["w"])


def test_held_weights_load_only_a_newer_version():
    sender, held, loaded = ObjectStoreSender(), HeldWeights(), []
    first = sender.publish({"w": torch.ones(1)})
    assert held.load_newer(first, loaded.append) and held.version == 1
    assert not held.load_newer(first, loaded.append) and not held.load_newer(None, loaded.append)
    assert held.load_newer(sender.publish({"w": torch.zeros(1)}), loaded.append) and held.version == 2
    assert [float(part["w"]) for part in loaded] == [1.0, 0.0]


def test_the_setup_builder_opens_a_broadcast_group_with_its_receivers():
    """One builder for the handshake: the learner's setup serves the rendezvous, each receiver joins its address
    while the learner opens its sender (gloo on CPU)."""
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2, dtype=torch.float64)}
    setup = SenderSetup("broadcast", receivers=1)
    assert setup.address.startswith("127.0.0.1:")
    ends = {}
    joining = threading.Thread(target=lambda: ends.update(r=open_receiver("broadcast", "cpu", setup.address, 1, 2)))
    joining.start()
    sender = setup.open(state, "cpu")
    joining.join(30)
    receiver = ends["r"]
    assert isinstance(receiver, BroadcastReceiver)
    got = {}
    receiving = threading.Thread(target=lambda: got.update({k: v.clone() for p in receiver.receive() for k, v in p.items()}))
    receiving.start()
    _, version = sender.publish(state)
    receiving.join(30)
    assert version == 1 and all(torch.equal(got[name], state[name]) for name in state)
    assert SenderSetup("object_store").address is None
