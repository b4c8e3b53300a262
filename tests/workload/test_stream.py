"""A streamed trace workload (sim.workload.stream): the same tables as the eager one, a few dozen bytes per
request not yet arrived, and a trace file changed under the run refused."""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sim
from sim.config import scenario_from_text
from sim.engine.build import build_components
from sim.engine.run import RunOptions, build_run
from sim.workload.stream import StreamedTrace


def _trace(path: Path, lines: int, seed: int = 3, too_long: int | None = None) -> Path:
    """A Mooncake-format trace: conversations whose turns extend a parent's hash ids."""
    rng = np.random.default_rng(seed)
    convs: list[list[int]] = []
    next_id, t, out = 1, 0, []
    for i in range(lines):
        t += int(rng.integers(0, 400))
        if convs and rng.random() < 0.5:
            ids = convs[int(rng.integers(len(convs)))] + list(range(next_id, next_id + int(rng.integers(1, 3))))
        else:
            ids = [0] + list(range(next_id, next_id + int(rng.integers(1, 4))))
        next_id = max(next_id, max(ids) + 1)
        convs.append(ids)
        if i == too_long:  # longer than max_model_len: rejected before the run
            ids = list(range(next_id, next_id + 70))
            next_id += 70
        length = 512 * (len(ids) - 1) + int(rng.integers(1, 513))
        out.append(
            json.dumps(
                {"timestamp": t, "input_length": length, "output_length": int(rng.integers(1, 40)), "hash_ids": ids}
            )
        )
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def _scenario(trace: Path, extra: str = "") -> str:
    return f"""
name: streamed
seed: 4
clock: time
model: {{preset: nemotron-h-8b}}
hardware: {{preset: h100-80g}}
cache: {{num_blocks: 120}}
scheduler: {{max_num_seqs: 16, max_num_batched_tokens: 4096, max_model_len: 32768}}
outputs: {{plots: false}}
workload:
  trace: {{format: mooncake, path: {trace}, allow_merged_blocks: true}}
{extra}"""


def _tables(result) -> dict[str, pd.DataFrame]:
    return {name: table.reset_index(drop=True) for name, table in result.tables.items()}


@pytest.mark.parametrize(
    "extra, max_steps",
    [
        ("", None),
        ("  limit: 60\n", None),
        ("  sample: 0.5\n", None),
        ("  time_window: [2, 30]\n", None),
        ("", 150),
    ],
    ids=["whole", "limit", "sample", "time_window", "max_steps"],
)
def test_streamed_tables_equal_the_eager_ones(tmp_path: Path, extra: str, max_steps: int | None) -> None:
    trace = _trace(tmp_path / "t.jsonl", 120, too_long=7)
    scenario = scenario_from_text(_scenario(trace, extra), str(tmp_path / "s.yaml"))
    assert isinstance(build_run(scenario, RunOptions(max_steps=max_steps)).components.requests, StreamedTrace)
    streamed = sim.run_scenario(scenario, None, options=RunOptions(max_steps=max_steps))
    eager = sim.run_scenario(scenario, None, options=RunOptions(max_steps=max_steps, retire_finished=False))
    assert streamed.status == eager.status
    for name, table in _tables(eager).items():
        pd.testing.assert_frame_equal(_tables(streamed)[name], table, check_exact=True)
    assert json.dumps(streamed.summary, sort_keys=True, default=str) == json.dumps(
        eager.summary, sort_keys=True, default=str
    )


def _held_bytes(build) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    held = build()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    return grown, held


def test_a_pending_request_costs_a_few_dozen_bytes(tmp_path: Path) -> None:
    """20,000 requests not yet arrived: under 200 B each streamed (48 B of columns plus the reader's
    bookkeeping), where the eager build holds every request whole (over 500 B each even for these short
    prompts)."""
    n = 20_000
    scenario = scenario_from_text(_scenario(_trace(tmp_path / "t.jsonl", n)), str(tmp_path / "s.yaml"))
    streamed_bytes, streamed = _held_bytes(lambda: build_components(scenario, streamed=True))
    assert isinstance(streamed.requests, StreamedTrace) and len(streamed.requests) == n
    eager_bytes, eager = _held_bytes(lambda: build_components(scenario))
    assert len(eager.requests) == n
    assert streamed_bytes / n < 200, streamed_bytes / n
    assert eager_bytes / n > 500, eager_bytes / n


def test_a_trace_changed_during_the_run_is_refused(tmp_path: Path) -> None:
    from sim.workload.errors import WorkloadError

    trace = _trace(tmp_path / "t.jsonl", 50)
    scenario = scenario_from_text(_scenario(trace), str(tmp_path / "s.yaml"))
    requests = build_components(scenario, streamed=True).requests
    assert isinstance(requests, StreamedTrace)
    requests.take(0)
    trace.write_text(trace.read_text().replace('"output_length"', '"output_length" ', 1), encoding="utf-8")
    with pytest.raises(WorkloadError, match="changed while the run was reading it"):
        requests.take(1)
