"""Synthetic workloads: an arrival process, a prefix structure, output lengths.

Each prefix structure decides which token streams a prompt is built from, and
therefore which prefix blocks requests share (blocks are hashed from content):

* ``unique``: stream ``gen:r<i>``; nothing is shared.
* ``shared_system``: ``gen:sys<k>`` (a pooled system prompt, Zipf popularity)
  then ``gen:r<i>:user``; requests with the same system prompt share it.
* ``multi_turn``: turn ``t`` of conversation ``c`` (request ``c<c>t<t>``) is the
  previous turn's prompt, then the previous turn's *answer*
  ``StreamSegment(output_stream(prev_id), 0, prev_output_len)``, then the new
  user message ``gen:c<c>:u<t>``. The answer is exactly the token content the
  previous request generates (:func:`sim.core.tokens.output_stream`), so the blocks
  it cached while decoding hash-match the next turn's prompt.
* ``fanout``: task ``a<i>`` has a context ``gen:a<i>:ctx``; its branches
  ``a<i>b<j>`` are the context plus ``gen:a<i>:b<j>``.
* ``rag``: a document pool ``gen:doc<d>``; each prompt holds
  ``docs_per_prompt`` distinct documents in random order, then a query
  ``gen:r<i>:q``. Only a common *leading* run of documents is a shared prefix.

Structures with an optional ``system`` pool put the system prompt first.

Turns and branches are open-loop: a turn arrives ``think_time`` after the
previous turn *arrived* (the workload cannot know when the answer finishes), so
choose think times longer than a turn's latency. ``metadata`` keeps
``parent``/``parents`` and ``think_time`` for the closed-loop driver
(``workload.sessions``, :mod:`sim.workload.sessions`), which releases a turn
after its parents *finished* instead. A ``fanout`` with ``join_len`` adds a
join request per task that quotes every branch's answer and waits for them all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from sim.core.tokens import Segment, StreamSegment, output_stream
from sim.workload.arrivals import arrival_times
from sim.workload.distributions import Dist, sample_lengths, sample_values
from sim.workload.draft import RequestDraft
from sim.workload.spec import (
    FanoutStructure,
    GeneratorSpec,
    MultiTurnStructure,
    RagStructure,
    SharedSystemStructure,
    SystemPromptPool,
    UniqueStructure,
)


def zipf_probabilities(n: int, exponent: float) -> np.ndarray:
    """``p_i ∝ 1 / (i + 1) ** exponent`` for ranks ``i = 0..n-1`` (0 = uniform)."""
    weights = 1.0 / np.arange(1, n + 1, dtype=float) ** exponent
    return weights / weights.sum()


class _Outputs:
    """Draws ``(max_tokens, output_len)``: the EOS point, capped at ``max_tokens`` if set."""

    def __init__(self, spec: GeneratorSpec, rng: np.random.Generator, base_dir: Path) -> None:
        self._dist: Dist = spec.output
        self._cap = spec.max_tokens
        self._rng = rng
        self._base_dir = base_dir

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        eos = sample_lengths(self._dist, self._rng, n, self._base_dir)
        if self._cap is None:
            return eos, eos
        return np.full(n, self._cap, dtype=np.int64), np.minimum(eos, self._cap)


class _SystemPool:
    """The pooled system prompts: lengths drawn once, picks by Zipf rank."""

    def __init__(self, pool: SystemPromptPool, rng: np.random.Generator, base_dir: Path) -> None:
        self._lengths = sample_lengths(pool.length, rng, pool.num_prompts, base_dir)
        self._probs = zipf_probabilities(pool.num_prompts, pool.zipf)
        self._rng = rng

    def pick(self, n: int) -> np.ndarray:
        return self._rng.choice(len(self._lengths), size=n, p=self._probs)

    def segments(self, index: int) -> tuple[Segment, ...]:
        return (StreamSegment(f"gen:sys{index}", 0, int(self._lengths[index])),)


def _system_prefixes(
    pool_spec: SystemPromptPool | None, n: int, rng: np.random.Generator, base_dir: Path
) -> tuple[list[tuple[Segment, ...]], Sequence[int | None]]:
    """Per arrival: the system-prompt segments (empty without a pool) and the pool index."""
    if pool_spec is None:
        return [()] * n, [None] * n
    pool = _SystemPool(pool_spec, rng, base_dir)
    picks: list[int] = pool.pick(n).tolist()
    prompts = {k: pool.segments(k) for k in set(picks)}  # segments are immutable: one tuple per pool prompt
    return [prompts[k] for k in picks], picks


def _unique(
    s: UniqueStructure, times: np.ndarray, rng: np.random.Generator, out: _Outputs, base_dir: Path
) -> list[RequestDraft]:
    n = len(times)
    lengths = sample_lengths(s.prompt, rng, n, base_dir)
    max_tokens, output_len = out.draw(n)
    return [
        RequestDraft(
            f"r{i}",
            float(times[i]),
            (StreamSegment(f"gen:r{i}", 0, int(lengths[i])),),
            int(max_tokens[i]),
            int(output_len[i]),
            order=i,
        )
        for i in range(n)
    ]


def _shared_system(
    s: SharedSystemStructure, times: np.ndarray, rng: np.random.Generator, out: _Outputs, base_dir: Path
) -> list[RequestDraft]:
    n = len(times)
    system, picks = _system_prefixes(s.system, n, rng, base_dir)
    user = sample_lengths(s.user_len, rng, n, base_dir).tolist()
    max_tokens, output_len = (a.tolist() for a in out.draw(n))
    arrivals = times.astype(np.float64).tolist()
    return [
        RequestDraft(
            f"r{i}",
            arrivals[i],
            system[i] + (StreamSegment(f"gen:r{i}:user", 0, user[i]),),
            max_tokens[i],
            output_len[i],
            order=i,
            metadata={"system_prompt": picks[i]},
        )
        for i in range(n)
    ]


def _multi_turn(
    s: MultiTurnStructure, times: np.ndarray, rng: np.random.Generator, out: _Outputs, base_dir: Path
) -> list[RequestDraft]:
    n = len(times)
    turns = sample_lengths(s.turns, rng, n, base_dir)
    total = int(turns.sum())
    system, picks = _system_prefixes(s.system, n, rng, base_dir)
    first = sample_lengths(s.first_len, rng, n, base_dir)
    follow = total - n
    user = sample_lengths(s.user_len, rng, follow, base_dir)
    think = sample_values(s.think_time, rng, follow, base_dir)
    max_tokens, output_len = out.draw(total)
    drafts: list[RequestDraft] = []
    k = 0  # index over follow-up turns
    for c in range(n):
        prompt = system[c] + (StreamSegment(f"gen:c{c}:u1", 0, int(first[c])),)
        at = float(times[c])
        parent: str | None = None
        for t in range(1, int(turns[c]) + 1):
            rid = f"c{c}t{t}"
            j = len(drafts)
            if parent is not None:
                prev = drafts[-1]
                prompt = prev.prompt + (
                    StreamSegment(output_stream(parent), 0, prev.output_len),
                    StreamSegment(f"gen:c{c}:u{t}", 0, int(user[k])),
                )
                at = prev.arrival + float(think[k])
                meta = {"conversation": c, "turn": t, "parent": parent, "think_time": float(think[k])}
                k += 1
            else:
                meta = {"conversation": c, "turn": t, "parent": None, "system_prompt": picks[c]}
            drafts.append(RequestDraft(rid, at, prompt, int(max_tokens[j]), int(output_len[j]), order=j, metadata=meta))
            parent = rid
    return drafts


def _fanout(
    s: FanoutStructure, times: np.ndarray, rng: np.random.Generator, out: _Outputs, base_dir: Path
) -> list[RequestDraft]:
    n = len(times)
    branches = sample_lengths(s.branches, rng, n, base_dir)
    total = int(branches.sum())
    system, picks = _system_prefixes(s.system, n, rng, base_dir)
    context = sample_lengths(s.context_len, rng, n, base_dir)
    suffix = sample_lengths(s.branch_len, rng, total, base_dir)
    spacing = sample_values(s.spacing, rng, total, base_dir)
    max_tokens, output_len = out.draw(total)
    drafts: list[RequestDraft] = []
    shared_prefixes = [system[i] + (StreamSegment(f"gen:a{i}:ctx", 0, int(context[i])),) for i in range(n)]
    for i in range(n):
        shared = shared_prefixes[i]
        at = float(times[i])
        for b in range(int(branches[i])):
            j = len(drafts)
            if b:
                at += float(spacing[j])
            drafts.append(
                RequestDraft(
                    f"a{i}b{b}",
                    at,
                    shared + (StreamSegment(f"gen:a{i}:b{b}", 0, int(suffix[j])),),
                    int(max_tokens[j]),
                    int(output_len[j]),
                    order=j,
                    metadata={"task": i, "branch": b, "system_prompt": picks[i]},
                )
            )
    if s.join_len is not None:
        drafts += _fanout_joins(s, drafts, shared_prefixes, rng, out, base_dir)
    return drafts


def _fanout_joins(
    s: FanoutStructure,
    branches: list[RequestDraft],
    shared_prefixes: list[tuple[Segment, ...]],
    rng: np.random.Generator,
    out: _Outputs,
    base_dir: Path,
) -> list[RequestDraft]:
    """One join ``a<i>j`` per task: context, each branch's answer, ``join_len`` new tokens.

    Drawn after every branch draw, so a spec without ``join_len`` draws exactly
    what it did before. Open-loop, the join arrives ``join_think`` after its
    last branch *arrived*; ``metadata['parents']`` lists the branches.
    """
    assert s.join_len is not None
    n = len(shared_prefixes)
    lengths = sample_lengths(s.join_len, rng, n, base_dir)
    think = sample_values(s.join_think, rng, n, base_dir)
    max_tokens, output_len = out.draw(n)
    by_task: dict[int, list[RequestDraft]] = {}
    for d in branches:
        by_task.setdefault(d.metadata["task"], []).append(d)
    joins = []
    for i in range(n):
        kids = by_task[i]
        prompt = shared_prefixes[i] + tuple(StreamSegment(output_stream(k.request_id), 0, k.output_len) for k in kids)
        prompt += (StreamSegment(f"gen:a{i}:join", 0, int(lengths[i])),)
        joins.append(
            RequestDraft(
                f"a{i}j",
                max(k.arrival for k in kids) + float(think[i]),
                prompt,
                int(max_tokens[i]),
                int(output_len[i]),
                order=len(branches) + i,
                metadata={"task": i, "parents": [k.request_id for k in kids], "think_time": float(think[i])},
            )
        )
    return joins


def _rag(
    s: RagStructure, times: np.ndarray, rng: np.random.Generator, out: _Outputs, base_dir: Path
) -> list[RequestDraft]:
    n = len(times)
    system, picks = _system_prefixes(s.system, n, rng, base_dir)
    doc_len = sample_lengths(s.doc_len, rng, s.num_documents, base_dir)
    popularity = zipf_probabilities(s.num_documents, s.zipf)
    query = sample_lengths(s.query_len, rng, n, base_dir)
    max_tokens, output_len = out.draw(n)
    drafts: list[RequestDraft] = []
    for i in range(n):
        chosen = rng.choice(s.num_documents, size=s.docs_per_prompt, replace=False, p=popularity)
        docs = rng.permutation(chosen)
        prompt = system[i] + tuple(StreamSegment(f"gen:doc{d}", 0, int(doc_len[d])) for d in docs)
        prompt += (StreamSegment(f"gen:r{i}:q", 0, int(query[i])),)
        drafts.append(
            RequestDraft(
                f"r{i}",
                float(times[i]),
                prompt,
                int(max_tokens[i]),
                int(output_len[i]),
                order=i,
                metadata={"documents": [int(d) for d in docs], "system_prompt": picks[i]},
            )
        )
    return drafts


_BUILDERS = {
    UniqueStructure: _unique,
    SharedSystemStructure: _shared_system,
    MultiTurnStructure: _multi_turn,
    FanoutStructure: _fanout,
    RagStructure: _rag,
}


def generate(spec: GeneratorSpec, rng: np.random.Generator, base_dir: Path) -> list[RequestDraft]:
    """The drafts of a generator spec, in generation order (not yet sorted by time)."""
    times = arrival_times(spec.arrivals, rng, spec.count, spec.duration)
    builder = _BUILDERS[type(spec.structure)]
    return builder(spec.structure, times, rng, _Outputs(spec, rng, base_dir), base_dir)  # type: ignore[operator]
