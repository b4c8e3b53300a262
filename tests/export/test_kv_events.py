"""export kv-events: a bundle's KV events as vLLM's own event stream (decoded with vLLM's classes when installed)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from typer.testing import CliRunner

import sim
from sim.cli import app
from sim.config import scenario_from_text
from sim.export.kv_events import export_kv_events, vllm_block_hashes, write_events

SCENARIO = """
name: events
seed: 5
clock: steps
cache: {block_size: 16, num_blocks: 60, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256, max_model_len: 4096, prefix_policy: pr48425}
outputs: {plots: false}
workload:
  generator:
    arrivals: {process: poisson, rate: 0.6}
    count: 25
    structure:
      kind: shared_system
      system: {num_prompts: 3, length: {dist: uniform, low: 60, high: 200}, zipf: 1.0}
      user_len: {dist: lognormal, mean: 40, sigma: 0.5}
    output: {dist: uniform, low: 2, high: 30}
"""


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "events"
    sim.run_scenario(scenario_from_text(SCENARIO), out)
    return out


def _decode(data: bytes) -> list[list]:
    return [msgspec.msgpack.decode(chunk) for chunk in _split(data)]


def _split(data: bytes) -> list[bytes]:
    """Cut a concatenation of msgpack values into the values."""
    dec = msgspec.msgpack.Decoder()
    out: list[bytes] = []
    view = memoryview(data)
    while view:
        # msgspec has no streaming decoder: find the shortest prefix that decodes.
        for end in range(1, len(view) + 1):
            try:
                dec.decode(view[:end])
            except msgspec.DecodeError:
                continue
            out.append(bytes(view[:end]))
            view = view[end:]
            break
        else:  # pragma: no cover
            raise AssertionError("trailing bytes")
    return out


def test_every_event_row_is_one_block_hash(bundle: Path) -> None:
    events = sim.load_result(bundle).tables["kv_events"]
    batches = _decode(export_kv_events(bundle))
    stored = removed = 0
    for _ts, events_of_step, *_ in batches:
        for event in events_of_step:
            if event["type"] == "BlockStored":
                stored += len(event["block_hashes"])
                assert len(event["token_ids"]) == len(event["block_hashes"]) * event["block_size"]
            elif event["type"] == "BlockRemoved":
                removed += len(event["block_hashes"])
    assert stored == int((events["kind"] == "stored").sum())
    assert removed == int((events["kind"] == "removed").sum())
    assert [b[0] for b in batches] == sorted(b[0] for b in batches)


def test_hashes_chain_over_the_published_tokens(bundle: Path) -> None:
    """A stored run's hashes are the sha256_cbor chain of its tokens from its parent (the wire contract)."""
    import hashlib

    import cbor2

    for _, events_of_step, *_ in _decode(export_kv_events(bundle)):
        for event in events_of_step:
            if event["type"] != "BlockStored":
                continue
            parent = event["parent_block_hash"]
            if parent is None:
                parent = hashlib.sha256(cbor2.dumps("vllm-none-hash", canonical=True)).digest()
            size = event["block_size"]
            for i, published in enumerate(event["block_hashes"]):
                tokens = tuple(event["token_ids"][i * size : (i + 1) * size])
                if size == 16:  # a group block of one hash block: the chain is over its own tokens
                    parent = hashlib.sha256(cbor2.dumps((parent, tokens, None), canonical=True)).digest()
                    assert published == parent


def test_decodes_with_vllms_own_classes_and_hashes(bundle: Path, vllm: str) -> None:
    from vllm.distributed.kv_events import BlockStored, KVEventBatch
    from vllm.utils.hashing import sha256_cbor
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(sha256_cbor)
    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    first = None
    for chunk in _split(export_kv_events(bundle)):
        batch = decoder.decode(chunk)
        for event in batch.events:
            if isinstance(event, BlockStored) and event.parent_block_hash is None and event.block_size == 16:
                first = event
    assert first is not None
    expected = kv_cache_utils.hash_block_tokens(sha256_cbor, None, first.token_ids[:16])
    assert first.block_hashes[0] == expected


def test_int_hashes_and_seed(bundle: Path) -> None:
    data = _decode(export_kv_events(bundle, int_hashes=True, hash_seed="42"))
    hashes = [h for _, evs, *_ in data for e in evs if e["type"] == "BlockStored" for h in e["block_hashes"]]
    assert hashes and all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    assert vllm_block_hashes(list(range(32)), 16, "42") != vllm_block_hashes(list(range(32)), 16, "vllm-none-hash")


def test_writer_refuses_links_and_existing_files(tmp_path: Path, bundle: Path) -> None:
    target = tmp_path / "user.txt"
    target.write_text("mine", encoding="utf-8")
    link = tmp_path / "link.msgpack"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        write_events(link, b"x")
    with pytest.raises(ValueError, match="user.txt"):
        write_events(target, b"x")
    assert target.read_text(encoding="utf-8") == "mine"
    result = CliRunner().invoke(app, ["export", "kv-events", str(bundle), "-o", str(tmp_path / "e.msgpack")])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(
        app, ["export", "kv-events", str(bundle), "-o", str(tmp_path / "e.msgpack"), "--instance", "0"]
    )
    assert result.exit_code == 2 and "--instance is for a cluster bundle" in result.output


PD = SCENARIO.replace("count: 25", "count: 12") + "cluster:\n  instances: [{role: prefill}, {role: decode}]\n"


def test_a_pd_cluster_exports_each_instance_with_its_own_requests(tmp_path: Path) -> None:
    """The prefill instance's requests are the legs (``<id>@prefill``) the P/D proxy made: its events carry
    the legs' tokens (the export raised a KeyError on the first leg); an instance out of range is refused in
    one line naming the count."""
    out = tmp_path / "pd"
    sim.run_scenario(scenario_from_text(PD), out)
    tables = sim.load_result(out).tables["kv_events"]
    for index in (0, 1):
        batches = _decode(export_kv_events(out, instance=index))
        stored = sum(len(e["block_hashes"]) for _, evs, *_ in batches for e in evs if e["type"] == "BlockStored")
        mine = tables.loc[tables["instance"] == index]
        assert stored == int((mine["kind"] == "stored").sum()) > 0
    result = CliRunner().invoke(app, ["export", "kv-events", str(out), "-o", str(tmp_path / "e"), "--instance", "2"])
    assert result.exit_code == 2
    assert "a cluster bundle of 2 instances; --instance 2 is not one of its instances (0 to 1)" in result.output
