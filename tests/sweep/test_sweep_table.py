from __future__ import annotations

import pyarrow as pa

from sim.sweep.table import build_table, flatten_summary


def test_flatten_joins_nested_keys_drops_empty_mappings_and_keeps_lists_as_json():
    summary = {"a": {"b": {"c": 1}, "d": {}}, "crash": None, "groups": ["full_attention", "mamba"], "n": 2}
    assert flatten_summary(summary) == {"a.b.c": 1, "crash": None, "groups": '["full_attention", "mamba"]', "n": 2}


def test_column_types_are_inferred_from_values_and_mixed_columns_become_yaml_text():
    rows = [
        {
            "run_id": "r0",
            "values": {"k.x": 1, "k.y": "a"},
            "seed": 0,
            "status": "ok",
            "error": None,
            "summary": {"seed": 0, "m": 1, "f": 0.5, "flag": True, "mix": 1},
        },
        {
            "run_id": "r1",
            "values": {"k.x": None, "k.y": 2},
            "seed": 1,
            "status": "failed",
            "error": "E: x",
            "summary": None,
        },
        {
            "run_id": "r2",
            "values": {"k.x": 3, "k.y": [1, 2]},
            "seed": 2,
            "status": "ok",
            "error": None,
            "summary": {"seed": 2, "m": 2, "f": 1, "flag": False, "mix": "x"},
        },
    ]
    table = build_table(["k.x", "k.y"], rows)
    assert table.column_names == [
        "run_id",
        "k.x",
        "k.y",
        "seed",
        "status",
        "error",
        "f",
        "flag",
        "m",
        "mix",
        "summary.seed",
    ]
    types = {name: table.schema.field(name).type for name in table.column_names}
    assert types["k.x"] == pa.int64() and types["k.y"] == pa.string()
    assert table.column("k.y").to_pylist() == ["a", "2", "[1, 2]"]
    assert types["f"] == pa.float64() and table.column("f").to_pylist() == [0.5, None, 1.0]
    assert types["flag"] == pa.bool_() and types["m"] == pa.int64()
    assert table.column("mix").to_pylist() == ["1", None, "x"]
    assert table.column("summary.seed").to_pylist() == [0, None, 2]
