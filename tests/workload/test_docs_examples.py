"""Every example in docs/workloads.md is valid and builds."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from sim.workload import WorkloadSpec, build_requests

DOC = Path(__file__).resolve().parents[2] / "docs" / "workloads.md"
BLOCKS = re.findall(r"```(yaml|json)\n(.*?)```", DOC.read_text(), re.S)


def as_workload(block: dict) -> dict:
    if "workload" in block:
        return block["workload"]
    generator = {
        "count": 20,
        "output": 8,
        "arrivals": {"process": "poisson", "rate": 1.0},
        "structure": {"kind": "unique", "prompt": 10},
    }
    generator.update(block)
    return {"generator": generator}


def test_the_doc_has_examples():
    assert sum(kind == "yaml" for kind, _ in BLOCKS) >= 10


@pytest.mark.parametrize("index", [i for i, (kind, _) in enumerate(BLOCKS) if kind == "yaml"])
def test_yaml_example_builds(index, tmp_path):
    workload = as_workload(yaml.safe_load(BLOCKS[index][1]))
    spec = WorkloadSpec.model_validate(workload)
    base = DOC.parents[1]  # a scenario at the repo root sees ../shared/traces
    if spec.trace is not None and not (base / spec.trace.path).is_file():
        pytest.skip(f"{spec.trace.path} is absent")
    if spec.trace is not None:
        spec.limit = 50
    reqs = build_requests(spec, base_dir=base, rng=np.random.default_rng(0), clock="time")
    assert reqs and all(1 <= r.output_len <= r.max_tokens for r in reqs)


def test_json_records_example_builds(tmp_path):
    lines = [kind_text for kind, kind_text in BLOCKS if kind == "json"]
    assert lines
    (tmp_path / "own.jsonl").write_text(lines[0])
    for line in lines[0].splitlines():
        json.loads(line)
    spec = WorkloadSpec.model_validate({"trace": {"format": "requests", "path": "own.jsonl"}})
    reqs = build_requests(spec, base_dir=tmp_path, rng=np.random.default_rng(0))
    assert [r.num_prompt_tokens for r in reqs] == [4, 803]
