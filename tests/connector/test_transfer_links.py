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
