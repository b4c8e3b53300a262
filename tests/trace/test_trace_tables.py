from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.core.kv.block_pool import KVEvent
from sim.trace.recorder import Recorder
from sim.trace.tables import (
    TABLE_NAMES,
    empty_table,
    hash_to_hex,
    hex_to_hash,
    normalize_table,
    tables_from_recorder,
)
from tests.support.kv import event_log

# docs/design.md §6 column lists, written out literally (two groups), then the recorder's extensions.
EXPECTED_COLUMNS = {
    "kv_events": ["seq", "step", "time_s", "kind", "group", "block_id", "block_hash", "request_id", "cause"],
    "admissions": [
        "step",
        "time_s",
        "request_id",
        "prompt_tokens",
        "hit_g0",
        "hit_g1",
        "local_tokens",
        "external_tokens",
        "hit_diverged",
        "fallback",
        "policy",
        "outcome",
        "crash_reason",
        "kind",
        "reason",
        "num_computed_tokens",
        "tokens_lost",
        "taint_origin",
        "lookup_seq",
        "claimed_boundary",
        "connector_asked_at",
        "connector_answer",
    ],
    "requests": [
        "request_id",
        "arrival_s",
        "first_scheduled_s",
        "first_token_s",
        "finished_s",
        "prompt_tokens",
        "output_tokens",
        "local_hit_tokens",
        "external_hit_tokens",
        "preemptions",
        "outcome",
    ],
    "schedule": ["step", "request_id", "kind", "num_scheduled_tokens", "num_computed_tokens", "preempted"],
    "steps": [
        "step",
        "time_s",
        "duration_s",
        "running",
        "waiting",
        "prefill_tokens",
        "decode_tokens",
        "free_blocks",
        "blocks_g0",
        "blocks_g1",
        "cached_g0",
        "cached_g1",
    ],
}


def _dtypes(df: pd.DataFrame) -> dict[str, str]:
    return {c: str(t) for c, t in df.dtypes.items()}


def _assert_arrow_equals_general(table: str, frame: dict) -> None:
    """A run's path (``arrow_table``: the declared schema, then ``frame_from_arrow``) and the reader's
    general path (``normalize_table``) give the same frame for the same recorded values (values,
    dtypes, row order), or the run's path refuses values the recorder never produces (ValueError
    naming the column)."""
    from sim.trace.schema import arrow_table
    from sim.trace.tables import frame_from_arrow

    try:
        got = frame_from_arrow(arrow_table(table, {k: list(v) for k, v in frame.items()}))
    except ValueError as exc:
        assert str(exc).startswith(f"{table}.")
        return
    want = normalize_table(table, {k: list(v) for k, v in frame.items()})
    assert _dtypes(got) == _dtypes(want)
    assert got.equals(want)
    for column in got.columns:
        if got[column].dtype.kind in "biuf":
            assert got[column].to_numpy().tobytes() == want[column].to_numpy().tobytes(), column


def test_columns_and_dtypes(recorder):
    t = tables_from_recorder(recorder)
    assert list(t) == list(TABLE_NAMES)
    for name, cols in EXPECTED_COLUMNS.items():
        assert list(t[name].columns) == cols, name
    assert _dtypes(t["kv_events"]) == {
        "seq": "int64",
        "step": "int64",
        "time_s": "float64",
        "kind": "str",
        "group": "int64",
        "block_id": "int64",
        "block_hash": "str",
        "request_id": "str",
        "cause": "str",
    }
    adm = _dtypes(t["admissions"])
    assert adm["hit_g1"] == "int64" and adm["hit_diverged"] == "bool" and adm["crash_reason"] == "str"
    req = _dtypes(t["requests"])
    assert req["finished_s"] == "float64" and req["preemptions"] == "int64"
    assert _dtypes(t["schedule"])["preempted"] == "bool"
    assert set(_dtypes(t["steps"]).values()) == {"int64", "float64"}


def test_deterministic_row_order(recorder):
    t = tables_from_recorder(recorder)
    assert t["kv_events"]["seq"].tolist() == list(range(10))
    # admissions: by step, ties in recording order (ra before rb at step 3)
    assert t["admissions"][["step", "request_id"]].values.tolist() == [[1, "rc"], [3, "ra"], [3, "rb"]]
    # requests: arrival then id
    assert t["requests"]["request_id"].tolist() == ["r0", "r1", "r2"]
    assert t["schedule"][["step", "request_id", "preempted"]].values.tolist() == [
        [0, "rz", True],
        [1, "rc", False],
        [1, "ra", False],
    ]
    assert t["steps"]["step"].tolist() == [0, 1, 2, 3]
    assert all(t[n].index.equals(pd.RangeIndex(len(t[n]))) for n in TABLE_NAMES)


def test_block_hash_hex_and_missing_values(recorder):
    kv = tables_from_recorder(recorder)["kv_events"]
    assert kv["block_hash"].tolist()[:4] == [
        "8000000000000000",
        "0000000000000000",
        "8000000000000001",
        "0000000000000001",
    ]
    cleared = kv[kv["kind"] == "cleared"].iloc[0]
    assert (cleared["group"], cleared["block_id"], cleared["request_id"]) == (-1, -1, "")
    req = tables_from_recorder(recorder)["requests"]
    assert req.loc[req["request_id"] == "r2", "finished_s"].isna().all()
    assert hash_to_hex(2**64 - 1) == "ffffffffffffffff" and hex_to_hash("ffffffffffffffff") == 2**64 - 1
    assert hash_to_hex(None) == "" and hex_to_hash("") is None
    with pytest.raises(ValueError, match="64-bit"):
        hash_to_hex(2**64)
    with pytest.raises(ValueError, match="hex"):
        hex_to_hash("FFFF")


def test_empty_tables_have_columns_and_dtypes():
    t = tables_from_recorder(Recorder(num_groups=3))
    for name in TABLE_NAMES:
        assert len(t[name]) == 0
        assert _dtypes(t[name]) == _dtypes(empty_table(name, 3))
    assert "hit_g2" in t["admissions"].columns and "cached_g2" in t["steps"].columns
    assert str(t["admissions"]["hit_diverged"].dtype) == "bool"
    assert str(t["kv_events"]["block_hash"].dtype) == "str"


def test_extension_column_backfilled_and_typed():
    rec = Recorder(num_groups=1)
    kw = dict(
        duration_s=0.1,
        running=0,
        waiting=0,
        prefill_tokens=0,
        decode_tokens=0,
        free_blocks=5,
        blocks_per_group=[0],
        cached_per_group=[0],
    )
    rec.record_step(**kw)
    rec.set_clock(1, 0.1)
    rec.record_step(**kw, extra={"offload_bytes": 4096})
    steps = tables_from_recorder(rec)["steps"]
    assert list(steps.columns)[-1] == "offload_bytes"
    assert str(steps["offload_bytes"].dtype) == "Int64"
    assert steps["offload_bytes"].isna().tolist() == [True, False]


def test_bad_values_name_the_column():
    df = empty_table("requests", 0).astype(object)
    df.loc[0] = ["r0", 0.0, 0.0, 0.0, 1.0, "many", 1, 0, 0, 0, "ok"]
    with pytest.raises(ValueError, match=r"requests\.prompt_tokens"):
        normalize_table("requests", df)
    with pytest.raises(ValueError, match="missing columns"):
        normalize_table("schedule", pd.DataFrame({"step": [0]}))
    with pytest.raises(ValueError, match="unknown table"):
        normalize_table("events", pd.DataFrame())


def test_recorder_tables_equal_the_general_path(recorder):
    """A recorder's five tables through the declared schemas equal the general path's frames of the same
    recorded lists (an event without a hash, a missing time, hashes at the 64-bit ends)."""
    from sim.trace.schema import arrow_tables_from_recorder
    from sim.trace.tables import frame_from_arrow

    rec = Recorder(num_groups=1)
    rec.record_kv_event_log(
        event_log(KVEvent("stored", 0, 3, 2**64 - 1, "r0", "cache"), KVEvent("cleared", -1, -1, 0, "", "reset"))
    )
    rec.record_request(
        **{
            **{c: 0 for c in EXPECTED_COLUMNS["requests"]},
            "request_id": "r0",
            "outcome": "ok",
            "arrival_s": 0,
            "first_token_s": None,
            "first_scheduled_s": 1.5,
            "finished_s": None,
        }
    )
    for source in (recorder, rec):
        arrow = arrow_tables_from_recorder(source)
        recorded = {
            "kv_events": source.kv_events.data,
            **{n: getattr(source, n).data for n in ("admissions", "requests", "schedule", "steps")},
        }
        for name in TABLE_NAMES:
            got, want = frame_from_arrow(arrow[name]), normalize_table(name, recorded[name])
            assert _dtypes(got) == _dtypes(want), name
            assert got.equals(want), name
    assert tables_from_recorder(rec)["kv_events"]["block_hash"].tolist() == ["ffffffffffffffff", "0000000000000000"]
    assert tables_from_recorder(rec)["kv_events"]["seq"].tolist() == [0, 1]


@pytest.mark.parametrize(
    "column,values",
    [
        ("prompt_tokens", [3, 2**62, -1]),
        ("prompt_tokens", [1, np.int64(7)]),
        ("prompt_tokens", [1, 2.0]),  # a float in an int column: the run's path refuses it
        ("prompt_tokens", [1, 2.5]),  # refused by both
        ("prompt_tokens", [1, 2**64]),  # beyond int64
        ("prompt_tokens", [1, None]),
        ("prompt_tokens", [1, 2**63 - 1, -(2**63)]),  # int64's ends: 'Q' refuses the negative, 'q' takes both
        ("prompt_tokens", [1, 2**63]),  # fits 'Q', not int64
        ("prompt_tokens", [2**64 - 1, 0]),
        ("prompt_tokens", [-1, 2**63]),
        ("prompt_tokens", [5, -(2**63) - 1]),
        ("prompt_tokens", [-1, None]),
        ("prompt_tokens", [-1, 2.0]),
        ("prompt_tokens", [None, -1]),
        ("prompt_tokens", [np.uint64(2**63), 1]),
        ("prompt_tokens", [np.int64(-3), 1]),
        ("prompt_tokens", [1, "2"]),
        ("arrival_s", [0, 1.5, np.float64(2.25)]),
        ("arrival_s", [0.5, None, 3]),
        ("arrival_s", [1.0, "2"]),
        ("arrival_s", [1e308, -0.0, float("inf")]),
        ("outcome", ["ok", "", "caf\u00e9"]),
        ("outcome", ["ok", None]),
        ("outcome", ["ok", 1]),
        ("outcome", ["ok", float("nan")]),
        ("outcome", [np.str_("ok"), "x"]),
    ],
)
def test_schema_columns_equal_the_general_path(column, values):
    """Values in a recorder's int, float or str column: the declared schema's column equals the general
    path's (values and dtype), or the run's path refuses them naming the column."""
    frame = {
        c: [v] * len(values)
        for c, v in zip(EXPECTED_COLUMNS["requests"], ["r", 0.0, 0.0, 0.0, 1.0, 1, 1, 0, 0, 0, "ok"])
    }
    frame[column] = list(values)

    _assert_arrow_equals_general("requests", frame)


@pytest.mark.parametrize(
    "values",
    [
        [5, 2**64 - 1, 0],
        [5, np.uint64(2**64 - 1), np.int64(7)],
        [np.uint64(3), 5],
        [5, None],  # an event without a hash
        [None, 5],
        [5, -1],
        [5, 2**64],
    ],
)
def test_hash_columns_equal_the_general_path(values):
    """Hash ints (or None) in a recorder's block_hash column: the hex column equals the general path's,
    or the run's path refuses a value outside [0, 2**64) naming the column."""
    n = len(values)
    frame = {c: list(range(n)) for c in ("seq", "step", "group", "block_id")}
    frame.update(
        time_s=[0.0] * n, kind=["stored"] * n, request_id=["r0"] * n, cause=["cache"] * n, block_hash=list(values)
    )

    _assert_arrow_equals_general("kv_events", frame)


def test_hash_hex_of_extreme_words():
    """The byte -> hex-pair table gives format(h, "016x") for every byte value in every position."""
    words = [0, 1, 2**64 - 1, 0x0123456789ABCDEF, 0xFEDCBA9876543210] + [b * 0x0101010101010101 for b in range(256)]
    column = normalize_table(
        "kv_events",
        {
            "seq": list(range(len(words))),
            "step": [0] * len(words),
            "time_s": [0.0] * len(words),
            "kind": ["stored"] * len(words),
            "group": [0] * len(words),
            "block_id": [1] * len(words),
            "block_hash": words,
            "request_id": ["r"] * len(words),
            "cause": ["cache"] * len(words),
        },
    )["block_hash"]
    assert column.tolist() == [format(w, "016x") for w in words]


REAL_SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


@pytest.mark.parametrize(
    "scenario", ["golden-pressure.yaml", "pathologies/dense-mamba-snapshots.yaml", "repro/nixl-mamba-deeper.yaml"]
)
def test_real_recorder_tables_equal_the_general_path(scenario):
    """A whole run's recorder columns: the declared schemas' five tables equal the general path's (values,
    dtypes, index), table by table."""
    from sim.api import RunOptions
    from sim.config import load_scenario
    from sim.engine.run import build_run

    record = build_run(load_scenario(REAL_SCENARIOS / scenario, ["outputs.plots=false"]), RunOptions()).execute()
    rec = record.recorder
    fast = tables_from_recorder(rec)
    recorded = {"kv_events": rec.kv_events.data, **{n: getattr(rec, n).data for n in TABLE_NAMES[1:]}}
    general = {name: normalize_table(name, recorded[name]) for name in TABLE_NAMES}
    for name in TABLE_NAMES:
        assert len(fast[name]) or name == "schedule", name
        assert _dtypes(fast[name]) == _dtypes(general[name]), name
        assert fast[name].index.equals(general[name].index), name
        assert fast[name].equals(general[name]), name


@pytest.mark.parametrize(
    "values",
    [
        [True, False, True],
        [True, np.True_, np.False_],
        [np.False_, np.False_],
        [True, None],  # refused by the run's path
        [True, 1],
        [True, "True"],
    ],
)
def test_bool_columns_equal_the_general_path(values):
    """Values in a recorder's bool column (``schedule.preempted``): the declared schema's column equals
    the general path's, or the run's path refuses anything but booleans naming the column."""
    n = len(values)
    frame = {
        "step": list(range(n)),
        "request_id": ["r0"] * n,
        "kind": ["prefill"] * n,
        "num_scheduled_tokens": [1] * n,
        "num_computed_tokens": [0] * n,
        "preempted": list(values),
    }

    _assert_arrow_equals_general("schedule", frame)


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, 2**64, -(2**63) - 1, 1e30, -1e30, "9223372036854775808"])
def test_an_int_column_value_beyond_64_bits_is_an_error_not_a_wrapped_number(value):
    # a malformed bundle's column: casting would wrap 2**63 to -2**63 silently
    frame = {c: [v, v] for c, v in zip(EXPECTED_COLUMNS["requests"], ["r", 0.0, 0.0, 0.0, 1.0, 1, 1, 0, 0, 0, "ok"])}
    frame["prompt_tokens"] = [1, value]
    with pytest.raises(ValueError, match=r"requests\.prompt_tokens: .* is outside the 64-bit integer range"):
        normalize_table("requests", frame)
    with pytest.raises(ValueError, match="outside the 64-bit integer range"):
        normalize_table("requests", pd.DataFrame(frame))


def test_int_columns_keep_the_64_bit_extremes():
    frame = {c: [v, v, v] for c, v in zip(EXPECTED_COLUMNS["requests"], ["r", 0.0, 0.0, 0.0, 1.0, 1, 1, 0, 0, 0, "ok"])}
    frame["prompt_tokens"] = [2**63 - 1, -(2**63), 7.0]
    assert normalize_table("requests", frame)["prompt_tokens"].tolist() == [2**63 - 1, -(2**63), 7]


def test_sort_order_is_pandas_stable_sort():
    """``sort_order`` gives ``DataFrame.sort_values(kind="mergesort", na_position="last")``'s row order
    on keys with ties, NaN, infinities, -0.0 next to 0.0, empty and non-ASCII strings."""
    from sim.trace.schema import sort_order

    rng = np.random.default_rng(5)
    floats = np.array([0.0, -0.0, 1.0, 2.5, np.nan, -1.0, np.inf, -np.inf])
    texts = np.array(["a", "b", "\u00e4", "Z", "", "ab", "\U0001f600", "a\x00"])
    dtypes = {"f": "float64", "s": "str", "i": "int64"}
    for _ in range(300):
        n = int(rng.integers(0, 25))
        cols = {"f": rng.choice(floats, n).tolist(), "s": rng.choice(texts, n).tolist(), "i": rng.integers(-3, 3, n)}
        for keys in (("f", "s"), ("f",), ("i", "s"), ("s",), ("i",)):
            want = pd.DataFrame(cols).sort_values(list(keys), kind="mergesort", na_position="last").index.to_numpy()
            perm = sort_order([(cols[k], dtypes[k]) for k in keys])
            got = list(range(n)) if perm is None else perm.tolist()
            assert got == want.tolist(), (keys, cols)


def test_run_tables_import_neither_pandas_nor_pyarrow_compute():
    """A run's tables through the declared schemas, their summary and their Parquet files need no pandas
    (pyarrow's own pa.array / to_numpy would import it), no pyarrow.compute (Array.take would: about
    0.03 s of a short run's CPU) and no pyarrow.parquet (its pyarrow.fs loads the cloud file systems and ssl:
    about 0.01 s; the writer is pyarrow._parquet's, sim.trace.bundle.parquet_writer) and no numpy.ma (np.unique
    imports it, np.percentile calls it: sim.results.metrics.percentiles)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from sim.api import RunOptions, run_scenario\n"
        "run_scenario('scenarios/golden-pressure.yaml', sys.argv[1], options=RunOptions(write_plots=False))\n"
        "assert 'pandas' not in sys.modules, 'pandas imported'\n"
        "assert 'pyarrow.compute' not in sys.modules, 'pyarrow.compute imported'\n"
        "assert 'pyarrow.parquet' not in sys.modules, 'pyarrow.parquet imported'\n"
        "assert 'pyarrow.fs' not in sys.modules, 'pyarrow.fs imported'\n"
        "assert 'numpy.ma' not in sys.modules, 'numpy.ma imported'\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = Path(__import__("tempfile").mkdtemp()) / "bundle"
    proc = subprocess.run([sys.executable, "-c", code, str(out)], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_kv_event_stamps_expanded_from_runs_equal_the_listed_rows():
    """``seq`` / ``step`` / ``time_s`` are kept as runs (one per log) and expanded with NumPy: the
    table must be the one the per-row lists (``KVEventTable.data``) give, dtypes and all."""
    rec = Recorder(num_groups=2)
    logs = [
        (0, 0.0, [KVEvent("stored", 0, 1, 7, "r0", "cache")] * 3),
        (0, 0.0, [KVEvent("removed", 1, 2, 8, "r1", "evict_lru")]),  # same clock: a run of its own
        (4, 0.125, [KVEvent("stored", 1, 5, 2**64 - 1, "r2", "cache"), KVEvent("cleared", -1, -1, 0, "", "reset")]),
        (9, 3.5, [KVEvent("removed", 0, 1, 7, "r0", "evict_lru")] * 5),
    ]
    for step, time_s, events in logs:
        rec.set_clock(step, time_s)
        rec.record_kv_event_log(event_log(*events))
    kv = rec.kv_events
    assert (kv.run_steps, kv.run_times, kv.run_lengths) == ([0, 0, 4, 9], [0.0, 0.0, 0.125, 3.5], [3, 1, 2, 5])
    listed = kv.data
    assert listed["seq"] == list(range(11)) and len(kv) == 11
    assert listed["step"] == [0] * 4 + [4] * 2 + [9] * 5
    assert listed["time_s"] == [0.0] * 4 + [0.125] * 2 + [3.5] * 5
    expanded = tables_from_recorder(rec)["kv_events"]
    general = normalize_table("kv_events", listed)
    assert _dtypes(expanded) == _dtypes(general)
    assert expanded.equals(general)
    assert expanded["time_s"].to_numpy().tobytes() == general["time_s"].to_numpy().tobytes()


@pytest.mark.parametrize(
    "table,column,values",
    [
        ("kv_events", "step", [3, 0, 2]),
        ("steps", "time_s", [0.5, -0.0, np.nan]),
        ("schedule", "preempted", [True, False]),
    ],
)
def test_a_numpy_column_of_the_schema_dtype_equals_its_list(table, column, values):
    """A 1-D array of the column's NumPy dtype is taken as it is: the same column as its values as a list."""
    n = len(values)
    fill = {"bool": False, "str": ""}
    base = {c: [fill.get(str(dtype), 0)] * n for c, dtype in empty_table(table, 1).dtypes.items()}
    if table == "kv_events":
        base["block_hash"] = [None] * n  # events without a hash
    from sim.trace.schema import arrow_table
    from sim.trace.tables import frame_from_arrow

    as_list = frame_from_arrow(arrow_table(table, {**base, column: list(values)}))
    as_array = frame_from_arrow(arrow_table(table, {**base, column: np.array(values)}))
    assert _dtypes(as_array) == _dtypes(as_list)
    assert as_array.equals(as_list)
    assert as_array[column].to_numpy().tobytes() == as_list[column].to_numpy().tobytes()


@pytest.mark.parametrize(
    "values",
    [["stored", "evicted", "", "a\x00b\x00", "é€", "stored_long_name"], ["only"], [f"cause{i}" for i in range(300)]],
)
def test_coded_strings_decoded_by_numpy_are_arrows_take(values):
    """``kind`` / ``cause`` rows decoded through NumPy (no pyarrow.compute) are the rows Arrow's dictionary
    ``take`` gives: empty values, NULs inside and at the end, non-ASCII, 4-byte codes, any slice."""
    import pyarrow.compute  # noqa: F401  (the reference below needs it; the writer does not)

    from sim.trace.recorder import CodedStrings
    from sim.trace.schema import _decoded, coded_array

    rng = np.random.default_rng(7)
    items = [values[i] for i in rng.integers(0, len(values), 2000)]
    column = CodedStrings()
    column.extend(items)
    for lo, hi in [(0, len(items)), (5, 1203), (9, 9)]:
        coded = coded_array(column, lo, hi)
        got = _decoded(column, lo, hi)
        got.validate(full=True)
        assert got.equals(coded.dictionary.take(coded.indices)) and got.to_pylist() == items[lo:hi]
