"""The simulator's fast paths, in one place (none of them is a vLLM feature).

Each one skips work whose answer is already known exactly; with the switch off
(``fast_paths: false``: ``RunOptions(fast_paths=False)``, ``HYBRIDSIM_PLAIN=1``,
``hybridsim run --plain``) every call takes vLLM's plain path. Both paths give
byte-identical tables (``tests/test_fastpath_differential.py``).

* :class:`QuietHorizons` (around ``allocate_slots``). Most calls of the
  scheduler's running loop give a running request a few more tokens inside
  blocks it already holds; then vLLM's per-group steps (skip, count, allocate,
  cache) change nothing and return no block. After each full call the KV
  manager notes, per request, a *quiet horizon*: bounds on ``computed + new``
  and on the processed tokens under which the next plain call (no hit, no
  external or lookahead tokens) provably changes nothing in any group. Each
  single-type manager answers its own bound (``quiet_horizon()``); this class
  only takes the minimum over the groups. Supported layouts: full attention and
  align-mode Mamba with one common block size; any other layout is plain.
* :class:`LookupMemo` (around a group type's ``find_longest_cache_hit``). An
  admission looks the same prefix up several times (the per-group hits of the
  admissions table, then the policy's lookup, which repeats the full-attention
  scan); while the pool's cache map is unchanged the answer is the same.

The scheduler's reuse of a head-of-line request's last lookup across steps
(``Scheduler.reuse_prefix_lookups``) is switched with these.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Protocol, Sequence

from sim.core.request import Request, RequestStatus

if TYPE_CHECKING:
    from sim.core.kv.pool import KVCacheBlock


class QuietGroup(Protocol):
    """What a single-type manager offers the quiet horizons."""

    block_size: int
    has_quiet_horizon: bool
    req_to_blocks: dict[str, list[KVCacheBlock]]

    def quiet_horizon(self, request_id: str) -> tuple[int, int] | None: ...


class QuietHorizon:
    """One request's horizon: valid while its first group's table is ``table``."""

    __slots__ = ("table", "max_main_tokens", "max_processed_tokens")

    def __init__(self, table: list[KVCacheBlock], max_main_tokens: int, max_processed_tokens: int) -> None:
        self.table = table
        self.max_main_tokens = max_main_tokens
        self.max_processed_tokens = max_processed_tokens


class QuietHorizons:
    """The quiet horizons of every request, for one KV manager.

    Invariant: a stored horizon is exact for the tables as they were after the
    last full ``allocate_slots`` of its request. The KV manager drops it before
    anything that could move a bound or replace a table (free, skip, cache, a
    full allocation), so a caller that changes tables only through the manager
    (the scheduler) may skip the call for a RUNNING request inside its horizon.
    ``max_tokens`` caps ``num_new_tokens``: a longer chunk may export a Mamba
    prefill checkpoint.
    """

    def __init__(
        self,
        groups: Sequence[QuietGroup],
        *,
        max_model_len: int,
        watermark_blocks: int,
        max_tokens: int,
        enabled: bool = True,
    ) -> None:
        self._groups = tuple(groups)
        self.enabled = (
            enabled
            and bool(groups)
            and len({g.block_size for g in groups}) == 1
            and all(g.has_quiet_horizon for g in groups)
        )
        self.max_model_len = max_model_len
        self.max_tokens = max_tokens if self.enabled else 0
        self._watermark = watermark_blocks > 0
        self._first_tables: dict[str, list[KVCacheBlock]] = groups[0].req_to_blocks if groups else {}
        self._horizons: dict[str, QuietHorizon] = {}

    def get(self, request_id: str) -> QuietHorizon | None:
        return self._horizons.get(request_id)

    def drop(self, request_id: str) -> None:
        self._horizons.pop(request_id, None)

    def note(self, request_id: str) -> None:
        """After a full ``allocate_slots``: store the minimum of every group's bounds (or none)."""
        if not self.enabled:
            return
        first = self._first_tables.get(request_id)
        if first is None:
            return
        max_main = max_processed = 1 << 62
        for group in self._groups:
            bounds = group.quiet_horizon(request_id)
            if bounds is None:
                return
            if bounds[0] < max_main:
                max_main = bounds[0]
            if bounds[1] < max_processed:
                max_processed = bounds[1]
        self._horizons[request_id] = QuietHorizon(first, max_main, max_processed)

    def covers(self, request: Request, num_new_tokens: int) -> bool:
        """A plain ``allocate_slots(request, num_new_tokens)`` is a proven no-op now.

        Checks the table is the one the horizon was noted for, and (under a
        watermark) that the request is not a WAITING/PREEMPTED admission.
        """
        horizon = self._horizons.get(request.request_id)
        if horizon is None or not 0 < num_new_tokens <= self.max_tokens:
            return False
        computed = request.num_computed_tokens
        if computed > self.max_model_len:
            computed = self.max_model_len
        return (
            computed + num_new_tokens <= horizon.max_main_tokens
            and computed - request.num_in_flight_tokens <= horizon.max_processed_tokens
            and self._first_tables.get(request.request_id) is horizon.table
            and not (self._watermark and request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED))
        )

    def take_decodes(
        self, running: list[Request], start: int, limit: int, scheduled: list[Request], num_scheduled: dict[str, int]
    ) -> int:
        """The scheduler's running loop over a run of quiet decodes, in one call.

        From ``running[start]``, at most ``limit`` requests (the token budget),
        each RUNNING request that has exactly one token left to compute, is below
        ``max_model_len - 1`` and whose 1-token call is inside its horizon is
        scheduled for 1 token (appended to ``scheduled`` / ``num_scheduled``), as
        the plain loop would: every clip of the plain loop leaves such a request
        at 1 token and ``allocate_slots`` would return no block. Stops at the
        first request that is not such a decode; returns how many it took.
        ``num_in_flight_tokens`` is 0 at ``schedule()`` (no async scheduling).
        """
        if not self.max_tokens:
            return 0
        horizons = self._horizons
        decode_cap = self.max_model_len - 1
        taken = 0
        for request in running[start:start + limit]:
            computed = request.num_computed_tokens
            if computed + 1 != request.num_prompt_tokens + request.num_output_tokens or computed >= decode_cap:
                break
            horizon = horizons.get(request.request_id)
            if horizon is None or computed >= horizon.max_main_tokens or computed > horizon.max_processed_tokens:
                break
            scheduled.append(request)
            num_scheduled[request.request_id] = 1
            taken += 1
        return taken


class LookupMemo:
    """Remembers each group type's last ``find_longest_cache_hit`` answer, for one pool.

    Key: the request's hash list (by identity, held so its id cannot be reused),
    its length (it only grows), ``max_length``, the group ids, and the pool's
    ``cache_generation`` (bumped on every cache-map change: while it is
    unchanged every lookup reads the same map). Answers are copied both ways,
    as callers trim the returned lists in place.
    """

    def __init__(self, block_pool: Any, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._pool = block_pool
        self._last: dict[tuple[int, ...], tuple[Any, int, int, int, tuple[list[KVCacheBlock], ...], int]] = {}

    def find_longest_cache_hit(
        self, cls: Any, block_hashes: Sequence[int], max_length: int, group_ids: Sequence[int],
        spec: Any, alignment_tokens: int,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """``cls.find_longest_cache_hit(block_hashes, max_length, group_ids, pool, spec, alignment_tokens)``."""
        pool = self._pool
        if not self.enabled:
            plain: tuple[tuple[list[KVCacheBlock], ...], int] = cls.find_longest_cache_hit(
                block_hashes, max_length, group_ids, pool, spec, alignment_tokens
            )
            return plain
        key = tuple(group_ids)
        last = self._last.get(key)
        generation = pool.cache_generation
        if (
            last is not None
            and last[0] is block_hashes
            and last[1] == len(block_hashes)
            and last[2] == max_length
            and last[3] == generation
        ):
            return tuple([*lst] for lst in last[4]), last[5]
        found, hit = cls.find_longest_cache_hit(block_hashes, max_length, group_ids, pool, spec, alignment_tokens)
        self._last[key] = (block_hashes, len(block_hashes), max_length, generation, tuple([*lst] for lst in found), hit)
        return found, hit


class _Parked:
    """One parked decode: its counters and both cohort clocks when it was parked."""

    __slots__ = ("request", "computed", "output", "sched_entry", "out_entry", "due")

    def __init__(self, request: Request, sched_entry: int, out_entry: int, due: int) -> None:
        self.request = request
        self.computed = request.num_computed_tokens
        self.output = request.num_output_tokens
        self.sched_entry = sched_entry
        self.out_entry = out_entry
        self.due = due


class DecodeCohort:
    """The event-driven running set: quiet decodes parked between their events.

    A RUNNING request that just sampled a token and whose next ``K >= 2`` steps
    are provably plain 1-token decodes (inside its quiet horizon, below
    ``max_model_len``, not reaching ``output_len``) is *parked*: the scheduler
    stops touching it per step. Its counters advance with two clocks instead,
    ``sched_clock`` (steps whose ``schedule()`` scheduled the cohort: its
    ``num_computed_tokens``) and ``out_clock`` (steps whose
    ``update_from_output`` sampled it: its ``num_output_tokens``); the step-time
    model's decode totals come from :meth:`decode_totals`. It is unparked
    (*materialized*: counters written back, block hashes caught up) at its event
    (``due``: the ``sched_clock`` after its K parked steps), or earlier when
    something else needs it: it is preempted, aborted, left unscheduled by the
    token budget, or the run ends.

    Invariant: every member is in the scheduler's ``running`` list, and each
    ``schedule()`` either schedules every member for one token or unparks it
    first; so ``sched_clock - sched_entry`` is the number of steps it was
    scheduled while parked. Members never finish, never cross a horizon
    bound and never touch a KV table while parked, so the plain path would
    have changed nothing else for them.
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self.sched_clock = 0
        self.out_clock = 0
        self.members: dict[str, _Parked] = {}
        #: Sum over members of ``computed - sched_entry`` (the context sum is this + n * sched_clock).
        self._context_base = 0
        self._heap: list[tuple[int, int, _Parked]] = []
        self._seq = 0

    def park(self, request: Request, steps: int) -> None:
        """Park ``request`` for its next ``steps`` decode steps (its counters are current)."""
        member = _Parked(request, self.sched_clock, self.out_clock, self.sched_clock + steps)
        self.members[request.request_id] = member
        self._context_base += member.computed - member.sched_entry
        self._seq += 1
        heapq.heappush(self._heap, (member.due, self._seq, member))

    def materialize(self, request_id: str) -> Request | None:
        """Unpark one member (no-op for a non-member): write its counters back; returns it."""
        member = self.members.pop(request_id, None)
        if member is None:
            return None
        request = member.request
        request.num_computed_tokens = member.computed + self.sched_clock - member.sched_entry
        request.num_output_tokens = member.output + self.out_clock - member.out_entry
        request.update_block_hashes()
        self._context_base -= member.computed - member.sched_entry
        return request

    def materialize_due(self) -> None:
        """Before ``schedule()``: unpark every member whose parked steps are used up."""
        heap = self._heap
        clock = self.sched_clock
        members = self.members
        while heap and heap[0][0] <= clock:
            member = heapq.heappop(heap)[2]
            if members.get(member.request.request_id) is member:
                self.materialize(member.request.request_id)

    def materialize_all(self) -> None:
        """Unpark everyone (the run ends, or a step the cohort cannot follow)."""
        for rid in list(self.members):
            self.materialize(rid)
        self._heap.clear()

    def num_computed(self, request_id: str) -> int:
        """A member's ``num_computed_tokens`` at the current ``sched_clock`` (without unparking it)."""
        member = self.members[request_id]
        return member.computed + self.sched_clock - member.sched_entry

    def decode_totals(self) -> tuple[int, int]:
        """``(members, sum of their num_computed_tokens)`` at the current ``sched_clock``."""
        n = len(self.members)
        return n, self._context_base + n * self.sched_clock

    @staticmethod
    def quiet_steps(request: Request, horizon: QuietHorizon | None, max_model_len: int) -> int:
        """How many next steps are plain 1-token decodes for ``request`` (right after it sampled).

        With ``c`` computed and ``o`` output tokens (``c + 1`` known tokens), its
        ``j``-th next step computes token ``c + j`` from ``c + j - 1``: the running
        loop takes it as a quiet decode while ``c + j - 1 < max_model_len - 1``,
        ``c + j <= max_main_tokens`` and ``c + j - 1 <= max_processed_tokens``
        (:meth:`QuietHorizons.take_decodes`), and it samples without stopping
        while ``o + j < output_len`` and ``c + j + 1 < max_model_len``.
        """
        if horizon is None:
            return 0
        c = request.num_computed_tokens
        return min(
            max_model_len - c - 2,
            horizon.max_main_tokens - c,
            horizon.max_processed_tokens - c + 1,
            request.output_len - request.num_output_tokens - 1,
        )
