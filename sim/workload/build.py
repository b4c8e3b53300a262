"""The single entry point: a ``workload:`` spec to a sorted list of requests."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterable, Literal, overload

import numpy as np

from sim.core.request import Request
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.generators import generate
from sim.workload.options import apply_options
from sim.workload.spec import WorkloadSpec
from sim.workload.stream import StreamedTrace, stream_trace, streams

CLOCKS = ("time", "steps")


@overload
def build_requests(
    spec: WorkloadSpec,
    *,
    base_dir: Path,
    rng: np.random.Generator,
    hash_block_size: int | None = None,
    clock: str = "time",
    read_at_most: int | None = None,
    stream: Literal[False] = False,
) -> list[Request]: ...


@overload
def build_requests(
    spec: WorkloadSpec,
    *,
    base_dir: Path,
    rng: np.random.Generator,
    hash_block_size: int | None = None,
    clock: str = "time",
    read_at_most: int | None = None,
    stream: bool,
) -> list[Request] | StreamedTrace: ...


def build_requests(
    spec: WorkloadSpec,
    *,
    base_dir: Path,
    rng: np.random.Generator,
    hash_block_size: int | None = None,
    clock: str = "time",
    read_at_most: int | None = None,
    stream: bool = False,
) -> list[Request] | StreamedTrace:
    """The workload's requests, sorted by ``(arrival_time, source order)``.

    Each request has ``output_len`` set (its EOS point, ``<= max_tokens``) and
    prompt content as stream/id segments; block hashes are left to the engine
    (``Request.set_block_hasher``). ``hash_block_size`` only validates the
    expansion of hash-block traces (Mooncake, Qwen). ``rng`` is split into two
    independent children, one for the generator and one for ``sample``, so
    sampling a trace does not depend on how many draws a generator used.
    Paths in the spec are relative to ``base_dir``. Bad input raises
    :class:`WorkloadError`. ``read_at_most`` stops reading a trace after that
    many requests in file order (``workload stats --limit``); traces are
    streamed, so reading costs memory only for the drafts kept. With ``stream``, a trace that
    :func:`~sim.workload.stream.streams` is returned as a :class:`~sim.workload.stream.StreamedTrace` (the same
    requests in the same order, each made when it is taken; 48 bytes a request until then).
    """
    if clock not in CLOCKS:
        raise WorkloadError(f"clock must be one of {', '.join(CLOCKS)}, got {clock!r}")
    gen_rng, sample_rng = rng.spawn(2)
    base_dir = Path(base_dir)
    if stream and read_at_most is None and streams(spec):
        return stream_trace(spec, base_dir, sample_rng, clock, hash_block_size)
    drafts: Iterable[RequestDraft]
    # A workload's source and its sessions import their modules only when the workload has them.
    if spec.requests is not None:
        from sim.workload.script import script_drafts

        drafts = script_drafts(spec.requests, clock)
    elif spec.generator is not None:
        drafts = generate(spec.generator, gen_rng, base_dir)
    else:
        assert spec.trace is not None
        from sim.workload.traces import read_trace

        drafts = read_trace(spec.trace, base_dir, hash_block_size)
        if read_at_most is not None:
            drafts = itertools.islice(drafts, read_at_most)
    kept = apply_options(drafts, spec, sample_rng, clock)
    _check_unique_ids(kept)
    if spec.sessions is not None:
        # A third child of the same seed: the first two are unchanged by it.
        (session_rng,) = rng.spawn(1)
        from sim.workload.sessions import annotate_sessions

        annotate_sessions(kept, spec, clock=clock, rng=session_rng, base_dir=base_dir)
    # Each draft is let go as its request is made (a long trace's drafts and requests are not all held twice).
    requests = []
    kept.reverse()
    while kept:
        requests.append(kept.pop().to_request())
    return requests


def _check_unique_ids(drafts: list[RequestDraft]) -> None:
    seen: set[str] = set()
    for d in drafts:
        if d.request_id in seen:
            raise WorkloadError(f"duplicate request id {d.request_id!r}")
        seen.add(d.request_id)
