"""Explicit request scripts (docs/design.md §7 ``workload.requests``) and their segments.

A segment spec becomes a :mod:`sim.core.tokens` segment without touching single
tokens: ``{content: X, start: S, tokens: N}`` is ``StreamSegment(X, S, N)``
(``start`` defaults to 0, so ``{content: X, tokens: N}`` is the first N
tokens of X, docs/design.md §7); ``{output_of: R, tokens: N}`` is the first N
tokens request R generates; ``{ids: [...]}`` is an :class:`IdsSegment`.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from sim.core.tokens import IdsSegment, Segment, StreamSegment, output_stream
from sim.workload.draft import RequestDraft
from sim.workload.errors import WorkloadError
from sim.workload.spec import (
    ContentSegmentSpec,
    IdsSegmentSpec,
    OutputSegmentSpec,
    RecordSpec,
    RequestFields,
    ScriptRequestSpec,
)


def to_segment(spec: ContentSegmentSpec | OutputSegmentSpec | IdsSegmentSpec) -> Segment:
    if isinstance(spec, ContentSegmentSpec):
        return StreamSegment(spec.content, spec.start, spec.tokens)
    if isinstance(spec, OutputSegmentSpec):
        return StreamSegment(output_stream(spec.output_of), spec.start, spec.tokens)
    return IdsSegment(np.asarray(spec.ids, dtype=np.int64))


def to_draft(spec: RequestFields, order: int, prompt: Sequence[Segment]) -> RequestDraft:
    """A draft from a request's fields and its converted prompt."""
    segments = tuple(prompt)
    output_len = spec.max_tokens if spec.output_len is None else min(spec.output_len, spec.max_tokens)
    return RequestDraft(
        spec.id,
        float(spec.at),
        segments,
        spec.max_tokens,
        output_len,
        order=order,
        priority=spec.priority,
        lora_name=spec.lora,
        cache_salt=spec.cache_salt,
    )


def record_prompt(record: RecordSpec) -> tuple[Segment, ...]:
    if record.token_ids is not None:
        return (IdsSegment(np.asarray(record.token_ids, dtype=np.int64)),)
    assert record.prompt is not None
    return tuple(to_segment(s) for s in record.prompt)


def script_drafts(requests: Sequence[ScriptRequestSpec], clock: str) -> list[RequestDraft]:
    """Drafts of a script; with ``clock: steps`` every ``at`` must be a step number."""
    drafts = []
    for order, spec in enumerate(requests):
        if clock == "steps" and not float(spec.at).is_integer():
            raise WorkloadError(
                f"workload.requests[{order}] (id {spec.id!r}): at={spec.at} is not a step number; "
                "with clock: steps, 'at' must be a whole number"
            )
        if not math.isfinite(spec.at):
            raise WorkloadError(f"workload.requests[{order}] (id {spec.id!r}): 'at' must be finite")
        draft = to_draft(spec, order, [to_segment(s) for s in spec.prompt])
        if spec.after:
            draft.metadata.update(parents=list(spec.after), think_time=spec.think)
        drafts.append(draft)
    return drafts
