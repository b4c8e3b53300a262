"""Columnar, plain-Python sink for everything a run records (docs/design.md §6).

The core calls the recorder; the recorder never calls back. It holds one list
per column, appends rows in the order the simulation produces them, and does
not import pandas: :mod:`sim.trace.tables` turns the columns into DataFrames.

Invariants:

* Column names and order of the contract columns are those of docs/design.md §6;
  extension columns come after them and are never reordered into them.
* ``kv_events.seq`` is dense from 0 in emission order; every row carries the
  ``step`` / ``time_s`` the engine set with :meth:`Recorder.set_clock` before
  the row was produced. Neither is stored per row (:class:`KVEventTable`).
* Per-group columns (``hit_g<i>``, ``blocks_g<i>``, ``cached_g<i>``) exist for
  ``i in range(num_groups)``.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Protocol, Sequence, Union

from sim.trace.dtypes import FIXED_DTYPES, FLOAT, INT, PER_GROUP

if TYPE_CHECKING:
    import pyarrow as pa


def kv_event_columns() -> list[str]:
    return ["seq", "step", "time_s", "kind", "group", "block_id", "block_hash", "request_id", "cause"]


def admission_columns(num_groups: int) -> list[str]:
    return (
        ["step", "time_s", "request_id", "prompt_tokens"]
        + [f"hit_g{i}" for i in range(num_groups)]
        + [
            "local_tokens",
            "external_tokens",
            "hit_diverged",
            "fallback",
            "policy",
            "outcome",
            "crash_reason",
            # extensions
            "kind",
            "reason",
            "num_computed_tokens",
            "tokens_lost",
            "taint_origin",
            "lookup_seq",
            "claimed_boundary",
            "connector_asked_at",
            "connector_answer",
        ]
    )


def request_columns() -> list[str]:
    return [
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
    ]


def schedule_columns() -> list[str]:
    return ["step", "request_id", "kind", "num_scheduled_tokens", "num_computed_tokens", "preempted"]


def step_columns(num_groups: int) -> list[str]:
    return (
        ["step", "time_s", "duration_s", "running", "waiting", "prefill_tokens", "decode_tokens", "free_blocks"]
        + [f"blocks_g{i}" for i in range(num_groups)]
        + [f"cached_g{i}" for i in range(num_groups)]
    )


#: The ``requests`` columns of times (seconds or steps; NaN, a null in the table, for a time not reached).
_REQUEST_TIMES = ("arrival_s", "first_scheduled_s", "first_token_s", "finished_s")
_NAN = float("nan")

#: The ``steps`` columns before the per-group ones, in order.
_STEP_FIXED = ("step", "time_s", "duration_s", "running", "waiting", "prefill_tokens", "decode_tokens", "free_blocks")


class KVEventColumns(Protocol):
    """Buffered KV events as one equal-length list per field (``sim.core.kv.block_pool.KVEventLog``)."""

    kind: list[str]
    group: list[int]
    block_id: list[int]
    block_hash: list[int]
    request_id: list[str]
    cause: list[str]

    def __len__(self) -> int: ...


class Columns:
    """One table as a dict of equal-length columns, with a fixed column order.

    A column is a list, or a typed ``array`` (``packed``: name -> ``"q"`` int64 or ``"d"`` float64) for the
    numbers the recorder itself always sets: a long run records a few rows per request in ``admissions``
    and ``steps``, and their counts and times are mostly distinct ints and floats, 32 bytes each as Python
    objects where a packed value takes 8. A value a packed column cannot take (None, a str, an int beyond
    int64) raises ``TypeError``/``OverflowError`` when it is recorded; the table's schema refuses it too.
    """

    __slots__ = ("names", "data", "_name_set", "spilled")

    def __init__(self, names: Sequence[str], packed: Mapping[str, str] | None = None) -> None:
        self.names = list(names)
        packed = packed or {}
        self.data: dict[str, list | array] = {n: array(packed[n]) if n in packed else [] for n in self.names}
        self._name_set = frozenset(self.names)
        #: Rows moved out to a :class:`TableSpill` (the first ``spilled`` rows); ``data`` holds the rows after.
        self.spilled = 0

    def append(self, row: dict) -> None:
        if row.keys() != self._name_set:
            missing = self._name_set - row.keys()
            extra = row.keys() - self._name_set
            raise KeyError(f"row does not match columns: missing {sorted(missing)}, unknown {sorted(extra)}")
        data = self.data
        for name, value in row.items():
            data[name].append(value)

    def add_column(self, name: str, default) -> None:
        """Append an extension column (e.g. a connector metric), back-filled. Only before any row was spilled
        (a spill takes only tables whose columns all have declared dtypes, :class:`TableSpill`)."""
        if name in self.data:
            return
        if self.spilled:
            raise ValueError(f"extension column {name!r} added after {self.spilled} rows were spilled")
        self.names.append(name)
        self._name_set = frozenset(self.names)
        self.data[name] = [default] * len(self)

    def __len__(self) -> int:
        return len(self.data[self.names[0]]) if self.names else 0


#: A packed column: a typed ``array`` while every value fits it, else (from the first value that does not)
#: a plain list.
PackedColumn = Union["array[int]", list]


def _extend_packed(column: PackedColumn, values: Sequence) -> PackedColumn:
    """``column`` with ``values`` appended: packed while they fit its type, else the column as a list (kept so)."""
    if isinstance(column, list):
        column.extend(values)
        return column
    n = len(column)
    try:
        column.extend(values)  # type: ignore[arg-type]
        return column
    except (TypeError, OverflowError):  # None, a float, or a value beyond the type: the exotic path
        del column[n:]  # array.extend appends up to the bad value
        out = column.tolist()
        out.extend(values)
        return out


def _extend_repeated(column: PackedColumn, value: int, k: int) -> None:
    """Append ``value`` ``k`` times to a packed column (a repeated typed array: a block copy, not ``k`` conversions)."""
    if isinstance(column, array):
        column.extend(array(column.typecode, (value,)) * k)
    else:
        column.extend([value] * k)


class _Codes(dict):
    """Distinct strings -> their code (0, 1, ... in order of first sight); a new string gets the next code."""

    def __missing__(self, key: str) -> int:
        code = self[key] = len(self)
        return code


class CodedStrings:
    """A column of strings drawn from few distinct values (an event's kind or cause), one code per row:
    a byte while there are at most 256 distinct values, then 4 bytes. ``values[codes[i]]`` is row ``i``."""

    __slots__ = ("codes", "values", "_index")

    def __init__(self) -> None:
        self.codes: array[int] = array("B")
        self.values: list[str] = []
        self._index = _Codes()

    def extend(self, items: Sequence[str]) -> None:
        n = len(self.codes)
        try:
            self.codes.extend(map(self._index.__getitem__, items))
        except OverflowError:  # the 257th distinct value: widen the codes
            del self.codes[n:]
            self.codes = array("I", self.codes)
            self.codes.extend(map(self._index.__getitem__, items))
        if len(self._index) > len(self.values):
            self.values = list(self._index)  # in code order (dicts keep insertion order)

    def tolist(self) -> list[str]:
        return list(map(self.values.__getitem__, self.codes))

    def __len__(self) -> int:
        return len(self.codes)


class KVEventTable:
    """The ``kv_events`` table: the six event fields packed per column, the clock stamps as runs.

    Invariants: rows are only appended, one non-empty event log at a time
    (:meth:`append_log`), so row ``i`` has ``seq == i`` and ``seq`` is not
    stored; log ``r`` is run ``r``: ``run_lengths[r] > 0`` consecutive rows,
    all stamped ``run_steps[r]`` / ``run_times[r]``. The six field columns have
    ``len(self) == sum(run_lengths)`` entries each. They are packed, as a long
    run records about 35 events per request: ``group`` and ``block_id`` int32
    and ``block_hash`` uint64 arrays (a column turns into a list at the first
    value its type cannot hold, e.g. a missing hash), ``kind`` and ``cause``
    one code a row (:class:`CodedStrings`), ``request_id`` a list of the
    requests' own id strings. :attr:`data` is the nine columns as lists, in
    :attr:`names` order (as :class:`Columns` holds them); ``sim.trace.schema``
    reads the packed columns directly instead.
    """

    __slots__ = (
        "names",
        "spilled",
        "removed_spilled",
        "kind",
        "group",
        "block_id",
        "block_hash",
        "request_id",
        "cause",
        "run_steps",
        "run_times",
        "run_lengths",
    )

    def __init__(self) -> None:
        self.names = kv_event_columns()
        #: Rows moved out to a :class:`TableSpill` (the first ``spilled`` rows, ``seq < spilled``); the
        #: columns and runs hold the rows after them.
        self.spilled = 0
        #: ``(group, cause) -> rows`` of the spilled ``removed`` events (the summary's eviction counts).
        self.removed_spilled: dict[tuple[int, str], int] = {}
        self.kind = CodedStrings()
        self.group: PackedColumn = array("i")
        self.block_id: PackedColumn = array("i")
        self.block_hash: PackedColumn = array("Q")
        self.request_id: list[str] = []
        self.cause = CodedStrings()
        self.run_steps: list[int] = []
        self.run_times: list[float] = []
        self.run_lengths: list[int] = []

    def append_log(self, log: KVEventColumns, step: int, time_s: float) -> None:
        """Append a non-empty event log's rows, all stamped ``step`` / ``time_s``."""
        self.run_steps.append(step)
        self.run_times.append(time_s)
        self.run_lengths.append(len(log))
        self.kind.extend(log.kind)
        self.group = _extend_packed(self.group, log.group)
        self.block_id = _extend_packed(self.block_id, log.block_id)
        self.block_hash = _extend_packed(self.block_hash, log.block_hash)
        self.request_id.extend(log.request_id)
        self.cause.extend(log.cause)

    def drop_first(self, rows: int) -> None:
        """Forget the first ``rows`` held rows (a spill took them): they count in :attr:`spilled`, their
        ``removed`` events in :attr:`removed_spilled`; a run they end early keeps its later rows."""
        if not 0 < rows <= self.held:
            raise ValueError(f"cannot drop {rows} of {self.held} held kv_events rows")
        kind = self.kind
        if "removed" in kind.values:
            removed = kind.values.index("removed")
            codes = kind.codes
            rows_removed = [i for i in range(rows) if codes[i] == removed]
            if rows_removed:
                counts = self.removed_spilled
                group, cause, causes = self.group, self.cause.codes, self.cause.values
                for i in rows_removed:
                    key = (int(group[i]), causes[cause[i]])
                    counts[key] = counts.get(key, 0) + 1
        del kind.codes[:rows]
        del self.cause.codes[:rows]
        del self.group[:rows]
        del self.block_id[:rows]
        del self.block_hash[:rows]
        del self.request_id[:rows]
        left, runs = rows, 0
        lengths = self.run_lengths
        while left and lengths[runs] <= left:
            left -= lengths[runs]
            runs += 1
        del self.run_steps[:runs], self.run_times[:runs], lengths[:runs]
        if left:
            lengths[0] -= left
        self.spilled += rows

    @property
    def held(self) -> int:
        """Rows still held (after the :attr:`spilled` ones)."""
        return len(self.kind)

    @property
    def data(self) -> dict[str, list]:
        """The nine columns of the held rows as lists (``seq`` and the stamps expanded from the runs)."""
        step: list[int] = []
        time_s: list[float] = []
        for s, t, n in zip(self.run_steps, self.run_times, self.run_lengths):
            step.extend([s] * n)
            time_s.extend([t] * n)
        return {
            "seq": list(range(self.spilled, len(self))),
            "step": step,
            "time_s": time_s,
            "kind": self.kind.tolist(),
            "group": list(self.group),
            "block_id": list(self.block_id),
            "block_hash": list(self.block_hash),
            "request_id": list(self.request_id),
            "cause": self.cause.tolist(),
        }

    def __len__(self) -> int:
        """Rows recorded (spilled and held): the next event's ``seq``."""
        return self.spilled + len(self.kind)


#: The schema dtypes a packed column can hold, and the ``array`` typecode it is packed as.
_TYPECODES = {INT: "q", FLOAT: "d"}


def _packed_columns(table: str, names: Sequence[str]) -> dict[str, str]:
    """``table``'s ``int64`` and ``float64`` columns among ``names`` (:data:`sim.trace.dtypes.FIXED_DTYPES`, the
    per-group ones ``int64``) -> typecode: for ``admissions`` and ``steps``, the numbers the recorder always fills."""
    fixed = FIXED_DTYPES[table]
    per_group = PER_GROUP.get(table, ())
    packed = {}
    for name in names:
        dtype = INT if name.startswith(per_group) and name not in fixed else fixed.get(name)
        if dtype in _TYPECODES:
            packed[name] = _TYPECODES[dtype]
    return packed


class TableSpill(Protocol):
    """Where a long run's ``steps`` and ``kv_events`` rows go while it runs (:class:`sim.trace.spill.ArrowSpill`):
    the recorder hands over a table each time it holds :attr:`rows` rows; :meth:`spill` moves whole groups of
    ``rows`` rows out of ``columns`` (their first rows, in order) and adds them to ``columns.spilled``, or leaves a
    table it cannot spill (one with extension columns) as it is; after the run :meth:`batches` gives the
    spilled groups back as Arrow tables, in order."""

    rows: int

    def spill(self, table: str, columns: Columns | KVEventTable) -> None: ...

    def batches(self, table: str) -> Iterator[pa.Table]: ...

    def column(self, table: str, name: str) -> list[pa.Array]: ...

    def flush(self, table: str, columns: Columns) -> None: ...


class Recorder:
    """Collects the rows of every result table during one run.

    With a :class:`TableSpill` the ``steps`` table (one row an engine step: about 37 a request on the Mooncake
    replay, 22 numbers each with Nemotron-H) is held at most ``spill.rows`` rows at a time; the rest is in the
    spill, in order."""

    def __init__(self, num_groups: int, record_schedule: bool = True, spill: TableSpill | None = None) -> None:
        self.num_groups = num_groups
        self.spill = spill
        self.schedule_enabled = record_schedule
        self.step = 0
        self.time_s = 0.0
        self.kv_events = KVEventTable()
        #: Called with each recorded batch of KV events and its time (``None``: nobody listens).
        self.kv_event_listener: Callable[[KVEventColumns, float], None] | None = None
        names = admission_columns(num_groups)
        self.admissions = Columns(names, _packed_columns("admissions", names))
        # One row a request, its counts and times packed (a long run's 1M rows held 5 distinct ints and 4
        # floats each, about 32-36 bytes apiece); a time it never reached is NaN, which the table makes null
        # (as it made None).
        names = request_columns()
        self.requests = Columns(names, _packed_columns("requests", names))
        self.schedule = Columns(schedule_columns())
        names = step_columns(num_groups)
        self.steps = Columns(names, _packed_columns("steps", names))
        self._hit_names = [f"hit_g{i}" for i in range(num_groups)]
        self._group_step_names = [(f"blocks_g{i}", f"cached_g{i}") for i in range(num_groups)]
        # The hot rows append to their column lists through bound methods (the lists are never replaced).
        adm = self.admissions.data
        self._hit_appends = tuple(adm[name].append for name in self._hit_names)
        steps = self.steps.data
        self._step_appends = tuple(steps[name].append for name in _STEP_FIXED)
        self._group_step_appends = tuple(
            (steps[blocks].append, steps[cached].append) for blocks, cached in self._group_step_names
        )
        self._num_step_columns = len(self.steps.names)

    def set_clock(self, step: int, time_s: float) -> None:
        """Stamp subsequent rows with this engine step and simulated time."""
        self.step = step
        self.time_s = time_s

    def record_kv_event_log(self, log: KVEventColumns) -> None:
        """Append a pool's event log (``sim.core.kv.block_pool.KVEventLog``), stamped with the current step and time;
        then hand it to :attr:`kv_event_listener`, if one is set (a cluster's router view)."""
        if len(log):
            events = self.kv_events
            events.append_log(log, self.step, self.time_s)
            spill = self.spill
            if spill is not None and events.held >= spill.rows:
                spill.spill("kv_events", events)
            if self.kv_event_listener is not None:
                self.kv_event_listener(log, self.time_s)

    def record_admission(
        self,
        *,
        request_id: str,
        prompt_tokens: int,
        hits: Sequence[int],
        local_tokens: int,
        external_tokens: int,
        hit_diverged: bool,
        fallback: bool,
        policy: str,
        outcome: str,
        crash_reason: str = "",
        kind: str = "first",
        reason: str = "",
        num_computed_tokens: int = 0,
        tokens_lost: int = 0,
        taint_origin: str = "",
        lookup_seq: int = 0,
        connector_asked_at: int = -1,
        connector_answer: int = -1,
    ) -> None:
        """One admission attempt (docs/design.md §6 ``admissions``).

        Extensions for ``hybridsim explain``: ``lookup_seq`` is the number of
        KV events emitted before the attempt's lookup (the cache it saw is
        ``kv_events`` rows with ``seq < lookup_seq``); ``claimed_boundary`` is
        ``local_tokens + external_tokens`` (set for a crashed attempt too);
        ``connector_asked_at`` / ``connector_answer`` are the position the
        connector was last shown and its answer (``-1``: not asked / no
        answer, i.e. not ready).
        """
        if len(hits) != self.num_groups:
            raise ValueError(f"expected {self.num_groups} per-group hits, got {len(hits)}")
        cols = self.admissions.data
        cols["step"].append(self.step)
        cols["time_s"].append(self.time_s)
        cols["request_id"].append(request_id)
        cols["prompt_tokens"].append(prompt_tokens)
        cols["local_tokens"].append(local_tokens)
        cols["external_tokens"].append(external_tokens)
        cols["hit_diverged"].append(bool(hit_diverged))
        cols["fallback"].append(bool(fallback))
        cols["policy"].append(policy)
        cols["outcome"].append(outcome)
        cols["crash_reason"].append(crash_reason)
        cols["kind"].append(kind)
        cols["reason"].append(reason)
        cols["num_computed_tokens"].append(num_computed_tokens)
        cols["tokens_lost"].append(tokens_lost)
        cols["taint_origin"].append(taint_origin)
        cols["lookup_seq"].append(lookup_seq)
        cols["claimed_boundary"].append(local_tokens + external_tokens)
        cols["connector_asked_at"].append(connector_asked_at)
        cols["connector_answer"].append(connector_answer)
        for append, h in zip(self._hit_appends, hits):
            append(h)
        spill = self.spill
        if spill is not None and len(self.admissions) >= spill.rows:
            spill.spill("admissions", self.admissions)

    def record_schedule(
        self, request_id: str, kind: str, num_scheduled_tokens: int, num_computed_tokens: int, preempted: bool
    ) -> None:
        """One scheduled (or preempted) request in the current step."""
        if not self.schedule_enabled:
            return
        cols = self.schedule.data
        cols["step"].append(self.step)
        cols["request_id"].append(request_id)
        cols["kind"].append(kind)
        cols["num_scheduled_tokens"].append(num_scheduled_tokens)
        cols["num_computed_tokens"].append(num_computed_tokens)
        cols["preempted"].append(bool(preempted))

    def record_schedule_rows(
        self,
        request_ids: Sequence[str],
        kinds: Sequence[str],
        num_scheduled_tokens: Sequence[int],
        num_computed_tokens: Sequence[int],
    ) -> None:
        """Scheduled (not preempted) requests of the current step, one row each, in order (parallel sequences)."""
        if not self.schedule_enabled:
            return
        n = len(request_ids)
        cols = self.schedule.data
        cols["step"].extend([self.step] * n)
        cols["request_id"].extend(request_ids)
        cols["kind"].extend(kinds)
        cols["num_scheduled_tokens"].extend(num_scheduled_tokens)
        cols["num_computed_tokens"].extend(num_computed_tokens)
        cols["preempted"].extend([False] * n)

    def record_step(
        self,
        duration_s: float,
        running: int,
        waiting: int,
        prefill_tokens: int,
        decode_tokens: int,
        free_blocks: int,
        blocks_per_group: Sequence[int],
        cached_per_group: Sequence[int],
        extra: Mapping[str, object] | None = None,
    ) -> None:
        """One engine step (values in column order); ``extra`` (column name -> value) fills the extension
        columns, adding any it names that do not exist yet (:meth:`Columns.add_column`)."""
        if extra or self._num_step_columns != len(self.steps.names):
            self._check_step_extras(extra or {})
        a = self._step_appends
        a[0](self.step)
        a[1](self.time_s)
        a[2](duration_s)
        a[3](running)
        a[4](waiting)
        a[5](prefill_tokens)
        a[6](decode_tokens)
        a[7](free_blocks)
        for (blocks_append, cached_append), blocks, cached in zip(
            self._group_step_appends, blocks_per_group, cached_per_group
        ):
            blocks_append(blocks)
            cached_append(cached)
        if extra:
            cols = self.steps.data
            for name, value in extra.items():
                cols[name].append(value)
        spill = self.spill
        if spill is not None and len(self.steps) >= spill.rows:
            spill.spill("steps", self.steps)

    def record_steps(
        self,
        first_step: int,
        starts: Sequence[float],
        durations: Sequence[float],
        running: int,
        waiting: int,
        prefill_tokens: int,
        decode_tokens: int,
        free_blocks: int,
        blocks_per_group: Sequence[int],
        cached_per_group: Sequence[int],
    ) -> None:
        """The rows of consecutive engine steps ``first_step, first_step + 1, ...`` that start at ``starts`` and
        differ in nothing else (a quiet stretch, ``sim.engine.stretch``): the rows :meth:`record_step` records
        for each after ``set_clock(step, start)``, with no extension column. The clock is left at the last."""
        k = len(starts)
        if not k:
            return
        steps = self.steps
        if self._num_step_columns != len(steps.names):
            raise KeyError(f"record_steps takes no extension columns (the table has {len(steps.names)} columns)")
        data = steps.data
        data["step"].extend(range(first_step, first_step + k))
        data["time_s"].extend(starts)
        data["duration_s"].extend(durations)
        for name, value in (
            ("running", running),
            ("waiting", waiting),
            ("prefill_tokens", prefill_tokens),
            ("decode_tokens", decode_tokens),
            ("free_blocks", free_blocks),
        ):
            _extend_repeated(data[name], value, k)
        for (blocks_name, cached_name), blocks, cached in zip(
            self._group_step_names, blocks_per_group, cached_per_group
        ):
            _extend_repeated(data[blocks_name], blocks, k)
            _extend_repeated(data[cached_name], cached, k)
        self.set_clock(first_step + k - 1, starts[-1])
        spill = self.spill
        if spill is not None and len(steps) >= spill.rows:
            spill.spill("steps", steps)

    def _check_step_extras(self, extra: Mapping[str, object]) -> None:
        """Add the extension columns ``extra`` names; a row must fill every extension column there is."""
        steps = self.steps
        for name in extra:
            steps.add_column(name, None)
        if len(extra) + len(self._group_step_names) * 2 + 8 != len(steps.names):
            missing = sorted(set(steps.names[8 + 2 * self.num_groups :]) - extra.keys())
            raise KeyError(f"row does not match columns: missing {missing}, unknown []")

    def column_values(self, table: str, name: str) -> Iterator[Any]:
        """One column of ``admissions`` or ``steps`` as Python values in recording order, the spilled rows
        (read back a group at a time) then the held ones: for the few readers of the whole run's rows."""
        columns: Columns = getattr(self, table)
        if columns.spilled and self.spill is not None:
            for chunk in self.spill.column(table, name):
                yield from chunk.to_pylist()
        yield from columns.data[name]

    def record_request(self, **row) -> None:
        """One finished (or failed) request (docs/design.md §6 ``requests``); a time it never reached is None."""
        for name in _REQUEST_TIMES:
            if row[name] is None:
                row[name] = _NAN
        self.requests.append(row)

    def settle_request_outcomes(self, worst: Mapping[str, str], crashed: str | None) -> None:
        """The outcome of each row recorded with a provisional one (:func:`sim.engine.request_rows.provisional_outcome`)
        made final: ``crash`` for the crashed request, its worst admission outcome (``worst``, ``ok`` if absent)
        for an ``ok`` one. A row recorded with its final outcome is left as it is."""
        data = self.requests.data
        outcomes = data["outcome"]
        for i, rid in enumerate(data["request_id"]):
            if rid == crashed:
                outcomes[i] = "crash"
            elif rid in worst and outcomes[i] == "ok":
                outcomes[i] = worst[rid]
