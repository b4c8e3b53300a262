"""Scripts and the workload options: window, sample, scale, clock, limit."""

import numpy as np
import pytest

from sim.core.tokens import StreamSegment, output_stream
from sim.workload import WorkloadError


def script(n=10, step=1.0):
    return [
        {"id": f"r{i}", "at": i * step, "prompt": [{"content": "doc", "tokens": 32 + i}], "max_tokens": 4}
        for i in range(n)
    ]


def test_script_becomes_requests_in_arrival_then_source_order(build):
    reqs = build(
        {
            "requests": [
                {"id": "late", "at": 5, "prompt": [{"content": "doc", "tokens": 80}], "max_tokens": 4, "output_len": 9},
                {"id": "b", "at": 0, "prompt": [{"content": "doc", "tokens": 80}], "max_tokens": 1, "priority": 2},
                {
                    "id": "a",
                    "at": 0,
                    "prompt": [{"content": "doc", "start": 8, "tokens": 8}, {"output_of": "b", "tokens": 1}],
                    "max_tokens": 3,
                    "output_len": 2,
                    "lora": "x",
                    "cache_salt": "s",
                },
            ]
        },
        clock="steps",
    )
    assert [r.request_id for r in reqs] == ["b", "a", "late"]
    b, a, late = reqs
    assert b.prompt == (StreamSegment("doc", 0, 80),) and b.priority == 2 and b.output_len == 1
    assert a.prompt == (StreamSegment("doc", 8, 8), StreamSegment(output_stream("b"), 0, 1))
    assert (a.lora_name, a.cache_salt, a.output_len, a.max_tokens) == ("x", "s", 2, 3)
    assert (late.arrival_time, late.output_len) == (5.0, 4)  # output_len is capped at max_tokens


def test_steps_clock_needs_whole_step_numbers(build):
    with pytest.raises(WorkloadError, match=r"requests\[0\] \(id 'r0'\): at=0.5 is not a step number"):
        build(
            {"requests": [{"id": "r0", "at": 0.5, "prompt": [{"content": "d", "tokens": 4}], "max_tokens": 1}]},
            clock="steps",
        )
    with pytest.raises(WorkloadError, match="clock must be one of time, steps"):
        build({"requests": script(1)}, clock="wall")


def test_window_shifts_then_scale_then_limit(build):
    reqs = build({"requests": script(10), "time_window": [2, 7], "time_scale": 0.5, "limit": 3})
    assert [r.request_id for r in reqs] == ["r2", "r3", "r4"]
    assert [r.arrival_time for r in reqs] == [0.0, 0.5, 1.0]


def test_steps_clock_floors_scaled_times(build):
    reqs = build({"requests": script(6), "time_scale": 0.5}, clock="steps")
    assert [r.arrival_time for r in reqs] == [0.0, 0.0, 1.0, 1.0, 2.0, 2.0]
    assert [r.request_id for r in reqs] == [f"r{i}" for i in range(6)]  # ties keep script order


def test_sample_is_seeded_and_keeps_the_fraction(build):
    wl = {"requests": script(4000, step=0.01), "sample": 0.25}
    a = [r.request_id for r in build(wl, seed=1)]
    assert a == [r.request_id for r in build(wl, seed=1)]
    assert a != [r.request_id for r in build(wl, seed=2)]
    assert len(a) / 4000 == pytest.approx(0.25, abs=0.025)


def test_generator_with_steps_clock_gives_integer_arrivals(build):
    reqs = build(
        {
            "generator": {
                "arrivals": {"process": "constant", "rate": 0.4},
                "count": 5,
                "structure": {"kind": "unique", "prompt": 8},
                "output": 2,
            }
        },
        clock="steps",
    )
    assert [r.arrival_time for r in reqs] == [2.0, 5.0, 7.0, 10.0, 12.0]
    assert np.all([r.arrival_time.is_integer() for r in reqs])
