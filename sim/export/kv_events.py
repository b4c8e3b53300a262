"""``hybridsim export kv-events``: a bundle's ``kv_events`` in vLLM's own KV-event stream format.

vLLM publishes prefix-cache changes as msgpack-encoded ``KVEventBatch`` es (``vllm.distributed.kv_events``):
one batch per engine step, holding ``BlockStored`` (the blocks one ``cache_full_blocks`` call cached for one
request in one group: their hashes, the parent hash, their token ids), ``BlockRemoved`` (one cache entry
dropped) and ``AllBlocksCleared`` events. Tools that consume that stream (KV-aware routers, indexers) can read
a hybridsim run through this export.

What the file holds, for a bundle of any run (a cluster's: ``--instance``):

* one batch per step that has events, ``ts`` the step's simulated time (seconds, or the step number under
  ``clock: steps``), in step order;
* a ``stored`` row run of one request in one group with consecutive blocks in one step becomes one
  ``BlockStored`` (vLLM's one event per ``cache_full_blocks`` call), each ``removed`` row one
  ``BlockRemoved``, each ``cleared`` one ``AllBlocksCleared``;
* token ids as ``hybridsim verify`` gives them to vLLM (:func:`sim.verify.lower.lowered_token_ids`);
* block hashes as a vLLM with ``prefix_caching_hash_algo: sha256_cbor`` computes them for those token ids:
  block ``k`` of a request hashes ``(parent, token ids, None)`` with SHA-256 over canonical CBOR, block 0's
  parent being ``sha256_cbor(seed)`` with ``seed`` the ``PYTHONHASHSEED`` given (``--hash-seed``) or vLLM's
  default ``"vllm-none-hash"``; a group with larger blocks uses the hash at its block's last hash-block
  boundary, as vLLM's ``BlockHashListWithBlockSize`` does. ``--int-hashes`` publishes the low 64 bits as
  ints (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).

Invariant: every ``kv_events`` row becomes exactly one block hash in one event (a ``stored`` run's blocks in
order), and the mapping from hybridsim's hash to vLLM's is one-to-one (both chain over the same content).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

#: vLLM's default seed of the first block's parent under a cryptographic hash (``DEFAULT_NONE_HASH_SEED``).
DEFAULT_HASH_SEED = "vllm-none-hash"
MEDIUM_GPU = "GPU"


class ExportError(ValueError):
    """The bundle cannot be exported (message: why, naming the file or request)."""


def _codec() -> Any:
    try:
        import cbor2
        import msgspec
    except ImportError:
        raise ExportError(
            "export kv-events needs msgspec and cbor2, an optional dependency: pip install 'hybridsim[events]'"
        ) from None
    return msgspec, cbor2


def sha256_cbor(value: Any) -> bytes:
    """vLLM's ``sha256_cbor``: SHA-256 of ``value``'s canonical CBOR encoding."""
    _, cbor2 = _codec()
    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


def vllm_block_hashes(token_ids: list[int], block_size: int, seed: str) -> list[bytes]:
    """The chained ``sha256_cbor`` hashes of the full ``block_size`` blocks of ``token_ids``."""
    parent = sha256_cbor(seed)
    out: list[bytes] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = sha256_cbor((parent, tuple(token_ids[start : start + block_size]), None))
        out.append(parent)
    return out


@dataclass(frozen=True)
class _Block:
    """Where one of hybridsim's block hashes sits: its request's tokens and hash-block index."""

    request_id: str
    index: int  # hash-block index of the block's last hash block


def _structs() -> tuple[type, type, type, type]:
    """The wire schema of vLLM's event classes (field names and order, tags, omitted defaults)."""
    msgspec, _ = _codec()

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True):  # type: ignore[name-defined,misc,call-arg]
        ts: float
        events: list[Any]
        data_parallel_rank: Optional[int] = None

    class BlockStored(msgspec.Struct, tag=True, omit_defaults=True):  # type: ignore[name-defined,misc,call-arg]
        block_hashes: list[Union[bytes, int]]
        parent_block_hash: Optional[Union[bytes, int]]
        token_ids: list[int]
        block_size: int
        lora_id: Optional[int]
        medium: Optional[str]
        lora_name: Optional[str]
        extra_keys: Optional[list[Any]] = None
        group_idx: Optional[int] = None

    class BlockRemoved(msgspec.Struct, tag=True, omit_defaults=True):  # type: ignore[name-defined,misc,call-arg]
        block_hashes: list[Union[bytes, int]]
        medium: Optional[str]
        group_idx: Optional[int] = None

    class AllBlocksCleared(msgspec.Struct, tag=True, omit_defaults=True):  # type: ignore[name-defined,misc,call-arg]
        pass

    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared


def export_kv_events(
    bundle: str | Path, *, hash_seed: str = DEFAULT_HASH_SEED, int_hashes: bool = False, instance: int | None = None
) -> bytes:
    """The msgpack stream of ``bundle``'s KV events (one encoded ``KVEventBatch`` after another)."""
    from sim.accel.hashing import SharedPrefixBlockHasher
    from sim.config import load_scenario
    from sim.engine.build import build_components
    from sim.results.cluster import select_instance
    from sim.trace.bundle import load_result
    from sim.trace.schema import hex_to_hash
    from sim.verify.lower import NotVerifiable, lowered_token_ids

    msgspec, _ = _codec()
    EventBatch, BlockStored, BlockRemoved, AllBlocksCleared = _structs()
    directory = Path(bundle)
    result = load_result(directory)
    events = result.tables["kv_events"]
    if "instance" in events.columns:
        count = int((result.summary.get("cluster") or {}).get("instances") or int(events["instance"].max()) + 1)
        if instance is None or not 0 <= instance < count:
            given = "give --instance" if instance is None else f"--instance {instance} is not one of its instances"
            raise ExportError(f"{directory}: a cluster bundle of {count} instances; {given} (0 to {count - 1})")
        result = select_instance(result, instance)
        events = result.tables["kv_events"]
    elif instance is not None:
        raise ExportError(f"{directory}: --instance is for a cluster bundle; this one has one instance")
    scenario = load_scenario(directory / "scenario.resolved.yaml")
    disaggregated = scenario.cluster is not None and scenario.cluster.disaggregated
    if scenario.cluster is not None and instance is not None:
        from sim.cluster.instances import instance_scenarios

        scenario = instance_scenarios(scenario)[instance]  # its own pool and connector
    components = build_components(scenario)
    assert components is not None
    config = components.kv_cache_config
    requests = list(components.requests)
    if disaggregated:  # a prefill instance's requests are the legs the P/D proxy made (as verify numbers them)
        from sim.cluster.pd import with_prefill_legs

        requests = with_prefill_legs(requests)
    outputs = dict(zip(result.tables["requests"]["request_id"], result.tables["requests"]["output_tokens"]))
    try:
        tokens = lowered_token_ids(requests)
    except NotVerifiable as exc:
        raise ExportError(f"{directory}: token ids cannot be lowered ({exc})") from None
    hbs = config.hash_block_size
    hasher = SharedPrefixBlockHasher(hbs)  # the speed layer's: the same hashes as the core's
    where: dict[int, _Block] = {}
    theirs: dict[str, list[bytes]] = {}
    ids: dict[str, list[int]] = {}
    for request in requests:
        rid = request.request_id
        produced = int(outputs.get(rid, 0) or 0)
        request.set_block_hasher(hasher)
        if produced:
            request.append_output_tokens(produced)
        base = tokens.output_base[rid]
        ids[rid] = tokens.prompts[rid] + list(range(base, base + produced))
        theirs[rid] = vllm_block_hashes(ids[rid], hbs, hash_seed)
        for k, ours in enumerate(request.block_hashes):
            where.setdefault(int(ours), _Block(rid, k))

    def publish(h: bytes) -> bytes | int:
        return int.from_bytes(h, "big") & ((1 << 64) - 1) if int_hashes else h

    def vllm_hash(group: int, block_hash: str) -> tuple[_Block, int]:
        ours = hex_to_hash(block_hash)
        if ours not in where:
            raise ExportError(f"{directory}: kv_events names block hash {block_hash}, which no request's content has")
        return where[ours], config.groups[group].spec.block_size // hbs

    encoder = msgspec.msgpack.Encoder()
    out = bytearray()
    batch: list[Any] = []
    batch_step: int | None = None
    batch_ts = 0.0
    run: list[tuple[_Block, int]] = []  # the open BlockStored run: (block, ratio)
    run_key: tuple[str, int] | None = None

    def close_run() -> None:
        nonlocal run, run_key
        if not run:
            return
        first, ratio = run[0]
        rid, group = run_key  # type: ignore[misc]
        chain = theirs[rid]
        start = first.index - ratio + 1
        batch.append(
            BlockStored(
                block_hashes=[publish(chain[b.index]) for b, _ in run],
                parent_block_hash=publish(chain[start - 1]) if start > 0 else None,
                token_ids=ids[rid][start * hbs : (run[-1][0].index + 1) * hbs],
                block_size=ratio * hbs,
                lora_id=None,
                medium=MEDIUM_GPU,
                lora_name=None,
                group_idx=group,
            )
        )
        run, run_key = [], None

    def close_batch() -> None:
        close_run()
        if batch:
            out.extend(encoder.encode(EventBatch(ts=batch_ts, events=list(batch))))
            batch.clear()

    for step, ts, kind, group, block_hash, rid in zip(
        events["step"], events["time_s"], events["kind"], events["group"], events["block_hash"], events["request_id"]
    ):
        if step != batch_step:
            close_batch()
            batch_step, batch_ts = int(step), float(ts)
        if kind == "stored":
            block, ratio = vllm_hash(int(group), str(block_hash))
            key = (str(rid), int(group))
            # Our hash says where the content is; a run continues while the next block follows on.
            block = _Block(str(rid), block.index) if str(rid) in theirs else block
            if run and (key != run_key or block.index != run[-1][0].index + ratio):
                close_run()
            run.append((block, ratio))
            run_key = key
        elif kind == "removed":
            close_run()
            block, _ = vllm_hash(int(group), str(block_hash))
            batch.append(
                BlockRemoved(
                    block_hashes=[publish(theirs[block.request_id][block.index])],
                    medium=MEDIUM_GPU,
                    group_idx=int(group),
                )
            )
        elif kind == "cleared":
            close_run()
            batch.append(AllBlocksCleared())
    close_batch()
    return bytes(out)


def write_events(out: Path, data: bytes, *, force: bool = False) -> None:
    """Write the stream to ``out`` through the one output writer (no link followed, an existing file replaced
    only with ``force`` and kept aside, atomic): a msgpack stream has no room for an ownership stamp."""
    from sim.trace.output import write_file

    write_file(out, data, force=force, option="-o/--out", stamped=False)
