import threading
import time

from rlfarm.roles.bus import Bus


def test_fires_on_item_count_without_waiting_for_timeout():
    bus = Bus(max_items=10, timeout_s=60)
    bus.put("a", units=4)
    assert not bus.ready()
    bus.put("b", units=6)
    started = time.monotonic()
    assert bus.take(wait_s=5) == ["a", "b"]
    assert time.monotonic() - started < 0.5
    assert len(bus) == 0


def test_fires_on_timeout_counted_from_first_item():
    bus = Bus(max_items=1000, timeout_s=0.2)
    bus.put("a", units=1)
    time.sleep(0.1)
    bus.put("b", units=1)  # does not restart the clock
    started = time.monotonic()
    assert bus.take(wait_s=5) == ["a", "b"]
    waited = time.monotonic() - started
    assert 0.05 < waited < 0.3


def test_take_returns_empty_when_nothing_fires():
    bus = Bus(max_items=10, timeout_s=0.05)
    assert bus.take(wait_s=0.1) == []


def test_take_wakes_when_a_producer_fills_the_bus():
    bus = Bus(max_items=3, timeout_s=60)
    threading.Timer(0.1, lambda: bus.put("x", units=3)).start()
    started = time.monotonic()
    assert bus.take(wait_s=5) == ["x"]
    assert time.monotonic() - started < 1.0


def test_fake_clock_drives_ready():
    now = [0.0]
    bus = Bus(max_items=100, timeout_s=1.0, clock=lambda: now[0])
    bus.put("a")
    assert not bus.ready()
    now[0] = 1.0
    assert bus.ready()


def test_a_backlog_fires_one_bus_at_a_time_in_order():
    """A labeler that fell behind gets its queue a bus at a time (N units, whole items), not as one call of every
    chunk in flight; what is left keeps its place, its timeout counted from its oldest item's arrival."""
    now = [0.0]
    bus = Bus(max_items=10, timeout_s=1.0, clock=lambda: now[0])
    for name in "abcde":
        bus.put(name, units=4)
        now[0] += 0.1
    assert bus.take(wait_s=0) == ["a", "b", "c"]  # the oldest, up to the first that reaches 10 units
    assert len(bus) == 8 and not bus.ready()        # 8 < 10, and "d" has waited 0.2 s of its 1 s
    now[0] = 1.35
    assert bus.take(wait_s=0) == ["d", "e"]         # "d" arrived at 0.3: its 1 s is up (from the take at 0.5 it would not be)
    assert bus.take(wait_s=0) == [] and len(bus) == 0
