import pytest
import simpy

from sim.connector.context import LinkSpec
from sim.engine.transfer import SimPyTransferService, StepTransferService


def test_processor_sharing_halves_bandwidth_for_overlapping_transfers():
    env = simpy.Environment()
    link = SimPyTransferService(env).make_link("pcie", LinkSpec(50e9, 10e-6))
    done = []
    link.submit(1_000_000_000, lambda: done.append(("a", env.now)))
    env.run(until=0.01)
    link.submit(250_000_000, lambda: done.append(("b", env.now)))
    env.run()
    # a alone for 0.01 - 10us at 50 GB/s moves 499.5 MB; b starts moving at 0.01001.
    # From 0.01001 both share: b's 250 MB at 25 GB/s -> done at 0.02001.
    assert done[0][0] == "b" and done[0][1] == pytest.approx(0.02001)
    # a: 1e9 - 50e9*(0.01001-1e-5) - 25e9*0.01 = 250 MB left at 50 GB/s -> 0.02501.
    assert done[1][0] == "a" and done[1][1] == pytest.approx(0.02501)
    assert link.stats.completed == 2 and link.stats.bytes_moved == 1_250_000_000


def test_concurrency_limit_serialises_fifo():
    env = simpy.Environment()
    link = SimPyTransferService(env).make_link("nic", LinkSpec(1e9, 1e-3, concurrency=1))
    done = []
    for name in "xyz":
        link.submit(1_000_000, lambda n=name: done.append((n, round(env.now, 9))))
    env.run()
    assert done == [("x", 0.002), ("y", 0.003), ("z", 0.004)]


def test_slowdown_multiplies_transfer_size():
    env = simpy.Environment()
    link = SimPyTransferService(env).make_link("l", LinkSpec(1e9, 0.0))
    done = []
    link.submit(1_000_000, lambda: done.append(env.now), slowdown=3)
    env.run()
    assert done == [pytest.approx(0.003)]


def test_step_link_completes_after_fixed_steps_in_submission_order():
    svc = StepTransferService()
    link = svc.make_link("l", LinkSpec(1e9, 0.0, steps=2))
    done = []
    svc.advance(3)
    link.submit(10, lambda: done.append("a"))
    link.submit(10, lambda: done.append("b"), slowdown=1.5)  # ceil(3) steps
    svc.advance(4)
    assert done == []
    svc.advance(5)
    assert done == ["a"]
    svc.advance(6)
    assert done == ["a", "b"]
    with pytest.raises(ValueError, match="cannot go back"):
        svc.advance(2)


def test_duplicate_link_name_and_bad_spec_are_refused():
    svc = StepTransferService()
    svc.make_link("l", LinkSpec(1.0, 0.0))
    with pytest.raises(ValueError, match="already exists"):
        svc.make_link("l", LinkSpec(1.0, 0.0))
    with pytest.raises(ValueError, match="bandwidth"):
        LinkSpec(0.0, 0.0)
    with pytest.raises(ValueError, match="concurrency"):
        LinkSpec(1.0, 0.0, concurrency=0)


def test_shared_link_ports_share_bandwidth_and_wake_their_own_engine():
    """Two engines' ports onto one link: their transfers share its bandwidth, each service sees only its own
    transfers as pending, and a completion wakes only the engine that submitted it (after ``on_done``)."""
    from sim.engine.transfer import TransferLink

    env = simpy.Environment()
    shared = TransferLink(env, LinkSpec(1e9, 0.0), "tier.read")
    services = [SimPyTransferService(env), SimPyTransferService(env)]
    log = []
    for i, svc in enumerate(services):
        svc.on_complete = lambda i=i: log.append(("wake", i, env.now))
    ports = [svc.attach("tier.read", shared) for svc in services]
    ports[0].submit(1_000_000, lambda: log.append(("done", 0, env.now)))
    ports[1].submit(2_000_000, lambda: log.append(("done", 1, env.now)))
    assert services[0].pending() and services[1].pending()
    env.run(until=0.0025)
    # Both at 0.5 GB/s until port 0's 1 MB is done at 2 ms; port 1 then alone: 1 MB more at 1 GB/s -> 3 ms.
    assert log == [("done", 0, pytest.approx(0.002)), ("wake", 0, pytest.approx(0.002))]
    assert not services[0].pending() and services[1].pending()
    env.run()
    assert log[2:] == [("done", 1, pytest.approx(0.003)), ("wake", 1, pytest.approx(0.003))]
    assert ports[1].stats.bytes_moved == 2_000_000 and shared.stats.bytes_moved == 3_000_000
    with pytest.raises(ValueError, match="already exists"):
        services[0].attach("tier.read", shared)
