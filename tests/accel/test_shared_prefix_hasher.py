"""``sim.accel.hashing``: the shared-prefix hasher reuses the hashes of common prompt starts, and gets exactly
what the core's plain hasher gets hashing every block of every request on its own."""

from __future__ import annotations

import numpy as np
import pytest

import sim.accel.hashing as accel_hashing
from sim.accel.hashing import SharedPrefixBlockHasher
from sim.core.kv import hashing
from sim.core.kv.hashing import RequestBlockHasher
from sim.core.request import Request
from sim.core.tokens import IdsSegment, StreamBlocksSegment, StreamSegment


def _request(rid: str, *segments, lora: str | None = None, salt: str | None = None) -> Request:
    return Request(rid, segments, max_tokens=40, lora_name=lora, cache_salt=salt)


def _alone(request: Request, block: int) -> list[int]:
    """The request's hashes from a fresh hasher (no other request seen), on a copy of the request."""
    copy = Request(
        request.request_id, request.prompt, max_tokens=40, lora_name=request.lora_name, cache_salt=request.cache_salt
    )
    copy.num_output_tokens = request.num_output_tokens
    copy.set_block_hasher(RequestBlockHasher(block))
    return copy.block_hashes


def _prompts():
    doc, sys_ = StreamSegment("doc", 0, 40), StreamSegment("sys", 0, 50)
    ids = IdsSegment(np.arange(20, dtype=np.int64))
    return [
        _request("a", sys_, StreamSegment("u-a", 0, 30)),
        _request("b", sys_, StreamSegment("u-b", 0, 7)),  # same system prompt, diverges mid-block
        _request("c", sys_, StreamSegment("u-a", 0, 30), StreamSegment("t2", 0, 25)),  # a's next turn
        _request("d", sys_, StreamSegment("u-a", 0, 30), StreamSegment("t2", 0, 25), StreamSegment("t3", 0, 9)),
        _request("m", sys_, StreamSegment("u-a", 0, 30), StreamSegment("t2", 5, 25)),  # same stream, elsewhere
        _request("e", StreamSegment("sys", 0, 20)),  # a shorter cut of the same stream
        _request("f", sys_, StreamSegment("u-a", 0, 30), salt="s1"),  # the salt changes block 0
        _request("g", sys_, StreamSegment("u-a", 0, 30), lora="l1"),  # the LoRA name changes every block
        _request("h", sys_, StreamSegment("u-a", 0, 30), lora="l1"),
        _request("i", ids, doc),  # explicit ids first: not reused
        _request("j", ids, doc),
        _request("k", StreamSegment("sys", 0, 8)),  # shorter than one block
        _request("l", sys_, StreamSegment("u-a", 0, 30), StreamSegment("t2", 0, 25), StreamSegment("t3", 0, 9)),
    ]


def test_shared_hasher_gives_every_request_its_own_hashes():
    for block in (4, 16, 48):
        hasher = SharedPrefixBlockHasher(block)
        for request in _prompts():
            request.set_block_hasher(hasher)
            assert request.block_hashes == _alone(request, block), (block, request.request_id)


def test_reused_prefix_stops_at_the_prompt_and_never_takes_another_requests_output_blocks():
    block = 16
    hasher = SharedPrefixBlockHasher(block)
    first = _request("a", StreamSegment("sys", 0, 40))
    first.set_block_hasher(hasher)
    first.num_output_tokens = 24  # 64 tokens: blocks 2 and 3 hold a's own output
    first.update_block_hashes()
    assert len(first.block_hashes) == 4
    second = _request("b", StreamSegment("sys", 0, 40), StreamSegment("more", 0, 30))
    second.set_block_hasher(hasher)
    assert second.block_hashes == _alone(second, block)
    assert second.block_hashes[:2] == first.block_hashes[:2] and second.block_hashes[2] != first.block_hashes[2]
    # a later output block of a request whose prompt was reused is hashed as usual
    second.num_output_tokens = 10
    second.update_block_hashes()
    assert second.block_hashes == _alone(second, block)


def test_common_prompt_start_is_hashed_once(monkeypatch):
    block = 16
    hasher = SharedPrefixBlockHasher(block)
    system = StreamSegment("long-system", 0, 320)  # 20 blocks
    digests: list[bytes] = []
    digest = hashing.xxh3_64_intdigest

    def counting_digest(data: bytes, seed: int = 0) -> int:
        digests.append(data)
        return digest(data, seed)

    monkeypatch.setattr(hashing, "xxh3_64_intdigest", counting_digest)
    _request("a", system, StreamSegment("u-a", 0, 16)).set_block_hasher(hasher)
    assert len(digests) == 21
    _request("b", system, StreamSegment("u-b", 0, 16)).set_block_hasher(hasher)
    # b only hashes its own last block: the 20 system blocks are not recomputed
    assert len(digests) == 22


@pytest.mark.parametrize("prompt_len", [32, 37, 48])
@pytest.mark.parametrize(("lora", "salt"), [(None, None), (None, "s1"), ("adapter", None)])
def test_output_blocks_hashed_from_the_output_stream_equal_the_segment_path(prompt_len, lora, salt):
    # once the prompt's blocks are hashed, the hasher hashes output blocks straight from the output
    # stream; each step's hashes must equal hashing the whole request (prompt + output) from scratch
    block = 16
    request = _request("r", StreamSegment("sys", 0, 20), StreamSegment("u", 3, prompt_len - 20), lora=lora, salt=salt)
    request.set_block_hasher(SharedPrefixBlockHasher(block))
    for step in (1, 1, 13, 2, 16, 31, 1, 40):
        request.append_output_tokens(step)
        assert request.block_hashes == _alone(request, block)
    assert len(request.block_hashes) == request.num_tokens // block


def _turns():
    """Prompts of trace hash blocks (trace block 8), as a conversation replay gives them: each turn
    repeats the ids of the turn before and adds its own; the last trace block of each may be partial."""
    run = lambda ids, length, prefix="mc:", block=8: StreamBlocksSegment(prefix, ids, block, length)  # noqa: E731
    return [
        _request("t1", run((0, 1, 2, 3), 29)),
        _request("t2", run((0, 1, 2, 3, 4, 5), 44)),  # t1's ids, and t1's partial last block is whole here
        _request("u1", run((0, 9, 10), 24)),  # another conversation with the same first id
        _request("t3", run((0, 1, 2, 3, 4, 5, 6), 49)),
        _request("t4", run((0, 1, 2, 7), 30)),  # diverges after three ids
        _request("t5", run((0, 1, 2, 3, 4, 5, 6), 49)),  # t3 again, whole
        _request("t6", run((0, 1, 2, 3, 4, 5, 6), 49), StreamSegment("tail", 0, 21)),  # t3, then more tokens
        _request("t7", run((0, 1, 2, 3, 4, 5, 6), 49), StreamSegment("tail", 0, 30)),
        _request("p1", run((0, 1, 2, 3), 29, prefix="qw:")),  # another trace's streams: nothing shared
        _request("b1", run((0, 1), 32, block=16)),  # another trace block size: other tokens
        _request("s1", run((0, 1, 2, 3, 4, 5), 44), salt="s"),
        _request("l1", run((0, 1, 2, 3, 4, 5), 44), lora="l"),
        _request("l2", run((0, 1, 2, 3, 4, 5, 6), 49), lora="l"),
    ]


@pytest.mark.parametrize("block", [4, 5, 8, 13, 20])
def test_trace_block_prompts_reuse_the_hashes_of_their_common_ids_exactly(block):
    hasher = SharedPrefixBlockHasher(block)
    for request in _turns():
        request.set_block_hasher(hasher)
        assert request.block_hashes == _alone(request, block), (block, request.request_id)
        # its output blocks join the hash list the next turn may reuse: only prompt tokens may be taken
        request.append_output_tokens(11)
        assert request.block_hashes == _alone(request, block), (block, request.request_id)


def test_a_conversations_next_turn_hashes_only_its_new_blocks(monkeypatch):
    hasher = SharedPrefixBlockHasher(10)
    digests: list[bytes] = []
    digest = hashing.xxh3_64_intdigest
    monkeypatch.setattr(hashing, "xxh3_64_intdigest", lambda data, seed=0: digests.append(data) or digest(data, seed))
    _request("t1", StreamBlocksSegment("mc:", (0, 1, 2, 3), 8, 29)).set_block_hasher(hasher)
    assert len(digests) == 2  # blocks [0, 10) and [10, 20)
    # the next turn shares 29 tokens (t1's last trace block is partial): its blocks 0 and 1 are t1's
    _request("t2", StreamBlocksSegment("mc:", (0, 1, 2, 3, 4, 5), 8, 44)).set_block_hasher(hasher)
    assert len(digests) == 2 + 2  # only blocks [20, 30) and [30, 40) are hashed


def test_the_hasher_remembers_at_most_max_prefixes_starts_the_latest_kept(monkeypatch):
    """A long trace's prompt starts are mostly distinct: the table keeps the most recently hashed
    ``MAX_PREFIXES`` keys (each holds a prompt and its hashes); a start dropped is hashed afresh, the same."""
    monkeypatch.setattr(accel_hashing, "MAX_PREFIXES", 3)
    hasher = SharedPrefixBlockHasher(10)
    for i in range(6):  # six conversations, two keys each: only the last three keys stay
        request = _request(f"c{i}", StreamBlocksSegment("mc:", (10 * i, 10 * i + 1, 10 * i + 2), 8, 24))
        request.set_block_hasher(hasher)
        assert request.block_hashes == _alone(request, 10)
    assert len(hasher._prefixes) == 3 and list(hasher._prefixes)[-1][-1] == 50  # c5's keys are the latest
    digests: list[bytes] = []
    digest = hashing.xxh3_64_intdigest
    monkeypatch.setattr(hashing, "xxh3_64_intdigest", lambda data, seed=0: digests.append(data) or digest(data, seed))
    latest = _request("c5b", StreamBlocksSegment("mc:", (50, 51, 52, 53), 8, 32))
    latest.set_block_hasher(hasher)  # c5's start is kept: its first two blocks are taken from c5
    assert latest.block_hashes == _alone(latest, 10)
    kept = len(digests)
    digests.clear()
    first = _request("c0b", StreamBlocksSegment("mc:", (0, 1, 2, 3), 8, 32))
    first.set_block_hasher(hasher)  # c0's start was dropped: every block is hashed again, to the same hashes
    assert first.block_hashes == _alone(first, 10)
    assert len(digests) == kept + 2
