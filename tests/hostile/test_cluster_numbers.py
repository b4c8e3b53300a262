"""Hostile numbers in a ``cluster`` section (issue 36, classes 5 and 8; the cluster keys came after the suite):
every numeric key of ``cluster``, ``cluster.router``, ``cluster.tier`` and ``cluster.pd`` given a huge, tiny,
negative, infinite or NaN value is refused in one line naming the key, or runs to a whole bundle; never a
traceback, never a file outside the output touched."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from hostile.common import BASE, assert_clean, assert_user_file_kept, invoke, plant_user_file

#: The base scenario on a two-instance cluster, with a shared tier or with P/D roles (the keys each needs).
TIERED = {"instances": 2, "router": {"policy": "prefix_aware"}, "tier": {"capacity_gb": 1.0}}
DISAGGREGATED = {"instances": [{"role": "prefill"}, {"role": "decode"}], "pd": {}}
KEYS = [
    (TIERED, ("instances",)),
    (TIERED, ("router", "view_delay")),
    (TIERED, ("router", "load_weight")),
    (TIERED, ("tier", "capacity_gb")),
    (TIERED, ("tier", "read_gbps")),
    (TIERED, ("tier", "write_gbps")),
    (TIERED, ("tier", "latency_us")),
    (TIERED, ("tier", "concurrency")),
    (TIERED, ("tier", "transfer_steps")),
    (TIERED, ("tier", "chunk_tokens")),
    (TIERED, ("tier", "group_capacity")),
    (DISAGGREGATED, ("pd", "bandwidth_gbps")),
    (DISAGGREGATED, ("pd", "latency_us")),
    (DISAGGREGATED, ("pd", "concurrency")),
    (DISAGGREGATED, ("pd", "transfer_steps")),
]
VALUES = [10**400, 2**63, 1e308, 1e-320, -1, 0, float("inf"), float("nan"), [0.5, 0.5]]


@pytest.mark.parametrize("cluster, key", KEYS, ids=[".".join(k) for _, k in KEYS])
def test_any_number_at_a_cluster_key_is_refused_in_one_line_or_runs(tmp_path: Path, cluster, key) -> None:
    base = yaml.safe_load(BASE)
    base["workload"]["requests"].append(
        {"id": "r1", "at": 1, "prompt": [{"content": "doc", "tokens": 56}], "max_tokens": 2}
    )
    base["outputs"] = {"plots": False}
    digest = plant_user_file(tmp_path)
    for i, value in enumerate(VALUES):
        doc = copy.deepcopy(base)
        doc["cluster"] = copy.deepcopy(cluster)
        owner = doc["cluster"]
        for part in key[:-1]:
            owner = owner.setdefault(part, {})
        owner[key[-1]] = value
        scenario = tmp_path / f"s{i}.yaml"
        scenario.write_text(yaml.safe_dump(doc), encoding="utf-8")
        res = invoke(["validate", scenario])
        assert_clean(res)
        if res.exit_code == 2:
            assert "cluster" in res.stderr, res.stderr
            continue
        out = tmp_path / f"out{i}"
        res = invoke(["run", scenario, "-o", out, "-q"])
        assert_clean(res)
        assert res.exit_code == 0 and (out / "summary.json").is_file(), (key, value, res.output)
    assert_user_file_kept(tmp_path, digest)
