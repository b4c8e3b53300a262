"""The public Mooncake traces in <repo>/../shared/traces load fast and have a sane ideal hit rate."""

from pathlib import Path

import numpy as np
import pytest

from sim.workload import WorkloadSpec, build_requests, workload_stats

TRACES = (Path(__file__).resolve().parents[2] / ".." / "shared" / "traces").resolve()


def load(name, **options):
    path = TRACES / name
    if not path.is_file():
        pytest.skip(f"{path} is absent (the shared traces live next to the repo)")
    spec = WorkloadSpec.model_validate({"trace": {"format": "mooncake", "path": name}, **options})
    return build_requests(spec, base_dir=TRACES, rng=np.random.default_rng(0), hash_block_size=16)


@pytest.mark.parametrize(
    "name, count, hit_range",
    [
        ("mooncake_conversation_trace.jsonl", 12031, (0.2, 0.6)),
        ("mooncake_synthetic_trace.jsonl", 3993, (0.4, 0.9)),
    ],
)
def test_trace_loads_and_hits_in_range(name, count, hit_range):
    # Load speed is measured by `make bench`, not asserted here (timed tests are flaky on shared cores).
    reqs = load(name)
    assert len(reqs) == count
    assert all(r.num_prompt_tokens >= 1 and 1 <= r.output_len == r.max_tokens for r in reqs)
    assert [r.arrival_time for r in reqs] == sorted(r.arrival_time for r in reqs)
    stats = workload_stats(reqs, 512)
    print(
        f"{name}: {stats['requests']} requests over {stats['duration']:.0f}s, "
        f"ideal prefix-hit rate at block size 512 = {stats['ideal_prefix_hit_rate']:.3f}"
    )
    assert hit_range[0] < stats["ideal_prefix_hit_rate"] < hit_range[1]


def test_finer_blocks_hit_at_least_as_much_on_a_window():
    reqs = load("mooncake_conversation_trace.jsonl", time_window=[0, 60], limit=80)
    coarse = workload_stats(reqs, 512)["ideal_prefix_hit_rate"]
    fine = workload_stats(reqs, 16)["ideal_prefix_hit_rate"]
    print(f"conversation, first minute ({len(reqs)} requests): ideal hit rate 16: {fine:.3f}, 512: {coarse:.3f}")
    # Shared content is whole 512-token blocks, so 16-token blocks see every 512 hit and more
    # (the partial tail of a shared block, and generated tokens).
    assert 0.01 < coarse <= fine < 1.0
