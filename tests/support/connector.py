"""Shared builders for the connector tests: contexts, requests, block tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from sim.connector.context import ConnectorContext, GroupLayout
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.request import Request
from sim.core.tokens import StreamSegment
from sim.engine.transfer import SimPyTransferService, StepTransferService

FA = "full_attention"
MAMBA = "mamba"


def groups(*kinds: str, block_size: int = 16, bytes_per_block: int = 1_000_000) -> tuple[GroupLayout, ...]:
    return tuple(GroupLayout(i, k, block_size, bytes_per_block) for i, k in enumerate(kinds))


def step_ctx(*kinds: str, seed: int = 0, **kw) -> tuple[ConnectorContext, StepTransferService]:
    svc = StepTransferService()
    return ConnectorContext(groups(*kinds, **kw), "steps", np.random.default_rng(seed), svc), svc


def time_ctx(*kinds: str, seed: int = 0, **kw) -> tuple[ConnectorContext, simpy.Environment]:
    env = simpy.Environment()
    return ConnectorContext(groups(*kinds, **kw), "time", np.random.default_rng(seed), SimPyTransferService(env)), env


def request(rid: str, *parts: tuple[str, int], hash_block_size: int = 16, max_tokens: int = 4) -> Request:
    segs = []
    for stream, n in parts:
        start = sum(s.length for s in segs if s.stream == stream)
        segs.append(StreamSegment(stream, start, n))
    req = Request(rid, segs, max_tokens)
    req.set_block_hasher(RequestBlockHasher(hash_block_size))
    return req


@dataclass
class Blk:
    block_id: int
    block_hash: object = None

    @property
    def is_null(self) -> bool:
        return self.block_id == 0


def table(*groups_ids: list[int], hashed: int = 0) -> tuple[list[Blk], ...]:
    """Per-group block objects; the first ``hashed`` non-null blocks of each group carry a hash."""
    out = []
    for ids in groups_ids:
        out.append([Blk(b, ("h", i) if i < hashed and b else None) for i, b in enumerate(ids)])
    return tuple(out)
