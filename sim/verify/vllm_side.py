"""Run a lowered script through the real vLLM ``Scheduler`` + ``KVCacheManager`` on CPU (vLLM 0.33 or 0.34).

STANDALONE: this module imports only the standard library and (lazily) vllm and
torch; it never imports ``sim``. ``hybridsim export vllm-test`` embeds it
verbatim into a self-contained pytest, so keep it that way.

One harness serves both supported releases (:data:`SUPPORTED_VERSIONS`). The
script names the release it was lowered for (``vllm_version``); the installed
vLLM must be that release (:class:`VersionMismatch` otherwise). What differs
between them at this seam, and how the harness handles it:

* 0.34's ``ModelRunnerOutput`` has no ``req_id_to_index`` (it indexes by
  ``req_ids``): the fabricated output passes it only where the field exists;
* 0.34 sends a resumed request as a new one (``NewRequestData``); the harness
  reads only ``num_scheduled_tokens`` and the request's own status, so nothing
  changes for it;
* 0.34's ``BlockHashToBlockMap`` stores one block id per key (``_cache``) and
  the ids of keys cached by several blocks in ``_dup_ids``, and is built with
  the pool's block list; 0.33 stored a block or a ``{block_id: block}`` dict.
  The recording map and the ``evict`` action read either;
* on x86, 0.34's ``CpuPlatform.check_and_update_config`` refuses to build a
  ``VllmConfig`` without triton (about 1 GB), which the scheduler path never
  uses. While the harness builds the config, ``vllm.triton_utils.HAS_TRITON``
  reads true, and it is restored right after (:func:`_triton_check_passed`);
  nothing in the scheduler or KV-cache manager reads it;
* 0.34's scheduler knobs are passed only to 0.34, and the scripted connector
  answers 0.34's ``may_load_async`` from its script.

Two plain, JSON-able formats cross this seam. Both are described here as
TypedDicts (documentation and type checking only; nothing is validated
against them at run time beyond what :func:`run_script` reads).

Lowered script (:class:`LoweredScript`, produced by ``sim/verify/lower.py``)
----------------------------------------------------------------------------
* ``groups``: one :class:`GroupScript` per KV-cache group, in group order:
  ``type`` (``full_attention`` | ``sliding_window`` | ``mamba``),
  ``block_size``, ``window`` (sliding window only) and ``prefill_checkpoints``
  (Mamba: the layers export the block-boundary state from inside a chunk,
  vLLM ``num_prefill_checkpoint_blocks = 1``).
* ``num_blocks`` (block 0 is the null block), ``scheduler_block_size``,
  ``hash_block_size``, ``enable_prefix_caching``, ``retention_interval``
  (``None`` dense, ``0``, or ``N`` tokens).
* scheduler limits: ``max_num_seqs``, ``max_num_batched_tokens``,
  ``max_model_len``, ``long_prefill_token_threshold``, ``scheduling_policy``
  (``fcfs`` | ``priority``), ``watermark``.
* ``vllm_version``: ``"0.33"`` or ``"0.34"``, the release the script was lowered for;
  ``token_id_end``: one past the largest token id the lowering assigned (for
  readers: every id fits a signed 32-bit integer, as 0.34's token buffer
  needs; the lowering gives one id per distinct token).
* 0.34's scheduler knobs (``None`` under 0.33, which lacks them; passed to
  ``SchedulerConfig`` only when set): ``cache_aware_admission_window``,
  ``cache_aware_admission_threshold``, ``max_num_inflight_kv_loads``.
* ``prefix_policy``: ``pr48425`` (vLLM as shipped) or ``max_per_group``
  (the pre-#48425 lookup, emulated on the scheduler instance: see
  :func:`_install_max_per_group`).
* ``connector``: ``None`` or a :class:`ConnectorScript` (the ``scripted``
  connector of hybridsim's docs/design.md §4: ``matched_tokens`` answered verbatim,
  ``holds`` answered ``max(0, min(N, num_tokens - 1) aligned - local)``,
  ``load_async`` bool or per-request map, ``async_load_steps``,
  ``supports_divergent_local_hybrid_hits``; under 0.34 it answers
  ``may_load_async`` with ``load_async`` for that request), or a
  :class:`ReplayScript` (``kind: replay``: a connector's answers recorded in a
  hybridsim run, ``sim/verify/replay.py``; each request's
  ``get_num_new_matched_tokens`` calls answered in order, ``may_load_async``,
  ``delay_free`` and ``has_pending_block_frees`` likewise; the recorded
  ``finished_recving`` / ``finished_sending`` handed to the scheduler's
  ``_update_from_kv_xfer_finished`` before the step they were handed over in;
  ``steps``, the steps hybridsim's engine ran, where an idle harness goes next).
* ``requests``: :class:`RequestScript` each: ``id``, ``arrival_step`` (added
  just before that step's ``schedule()``), explicit ``prompt_token_ids``,
  ``max_tokens``, ``priority`` and ``output_token_base`` (the k-th sampled
  token is ``output_token_base + k``; the lowering makes these never equal a
  prompt token or another request's outputs).
* ``actions``: :class:`ActionScript` each, applied just before step ``at_step``:
  ``evict`` (``request``, ``groups``, ``block_indices``: one
  ``KVCacheManager.evict_blocks`` call dropping every block cached under the
  hash of that request's prompt block ``i`` in each group, group by group, in
  the order of the indices, then by ascending block id) or
  ``reset_prefix_cache``.
* ``max_steps``: the run stops after this many steps if requests remain.

Decision trace (:class:`DecisionTrace`, returned by :func:`run_script`)
-----------------------------------------------------------------------
* ``steps``: one :class:`StepTrace` per step in which anything happened (a
  scheduled token, a preemption, an admission attempt or a KV event), in step
  order. ``scheduled`` is ``[[request_id, tokens], ...]`` in scheduling order;
  ``preempted`` the request ids preempted in that step, in order;
  ``admissions`` every admission attempt of a waiting request
  (:class:`AdmissionTrace`: ``request``, ``kind`` ``first`` |
  ``after_preemption`` | ``after_async_load``, per-group ``hits`` (each group's
  independent hit capped at ``num_tokens - 1``), ``local`` and ``external``
  (what ``allocate_slots`` was given, or the last values known before a
  crash), ``hit_diverged`` (the lookup's flag), ``fallback`` (the
  ``hit_diverged and external == 0`` re-lookup fired), ``result``
  ``admitted`` | ``no_blocks`` (``allocate_slots`` returned ``None``) |
  ``skipped`` (left waiting without an allocation: connector not ready,
  no block-aligned chunk) | ``crash``); ``kv_events`` every change of the
  prefix cache (:class:`KVEventTrace`: ``kind`` ``stored`` | ``removed`` |
  ``cleared``, ``group``, ``block_id``, ``hash``: the block hash numbered by
  first appearance in the trace, so two traces compare without sharing a hash
  function; ``cleared`` has group, block and hash -1).
* ``crash``: ``None`` or :class:`CrashTrace` (``step``, ``request`` (the
  request being handled, or ``None``), ``type`` (exception class name),
  ``message`` (its text; for a bare ``assert`` the asserted expression)).
* ``finished``: request id -> number of generated tokens, for finished requests.
* ``num_steps``: steps run; ``stopped``: ``""`` or why the run stopped early
  (``crash``, ``max_steps``, ``stalled``).
* ``replay_mismatches`` (a replayed connector only): each call the record did
  not hold or held for another step or local hit (``step``, ``message``), and
  at the end each recorded lookup vLLM never asked for; the comparison treats
  one as a difference at its step.

Idle steps: after a step that scheduled nothing and preempted nothing, with
no async load in flight or finished in it, the harness skips to the next step with an arrival
or an action (the skipped steps would repeat the same failed attempts on an
unchanged cache), as hybridsim's engine sleeps; with none left and requests
remaining, the run stops as ``stalled``. With a replayed connector it skips to
the next step hybridsim's engine ran (whose transfers may have changed the
connector's answers) if that comes first.

``run_script(script, record=False)`` only steps (no trace is built; for
``make bench``).
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import shutil
import sys
import tempfile
import traceback
from typing import Any, Iterator, Literal, NotRequired, Optional, TypedDict, Union

# --------------------------------------------------------------------------- formats


class GroupScript(TypedDict):
    type: Literal["full_attention", "sliding_window", "mamba"]
    block_size: int
    window: Optional[int]
    prefill_checkpoints: bool


class ConnectorScript(TypedDict):
    matched_tokens: dict[str, int]
    holds: dict[str, int]
    load_async: Union[bool, dict[str, bool]]
    async_load_steps: int
    supports_divergent_local_hybrid_hits: bool


class ReplayScript(TypedDict):
    """A connector's recorded answers (``sim/verify/replay.py``), answered back in the same order."""

    kind: Literal["replay"]
    supports_divergent_local_hybrid_hits: bool
    #: request id -> ``[step, num_computed_tokens, tokens or None, load_async]`` per call, in call order.
    lookups: dict[str, list[list[Any]]]
    may_load_async: dict[str, list[bool]]
    delay_free: dict[str, list[bool]]
    pending_block_frees: list[bool]
    #: ``[step, finished_recving, finished_sending]``: handed to the scheduler before that step's schedule().
    finished: list[list[Any]]
    #: ``[first, last]`` runs of the steps the engine ran.
    steps: list[list[int]]


class RequestScript(TypedDict):
    id: str
    arrival_step: int
    prompt_token_ids: list[int]
    max_tokens: int
    priority: int
    output_token_base: int


class ActionScript(TypedDict, total=False):
    at_step: int
    kind: Literal["evict", "reset_prefix_cache"]
    request: str
    groups: list[int]
    block_indices: list[int]


class LoweredScript(TypedDict):
    version: int
    name: str
    vllm_version: str
    token_id_end: int
    groups: list[GroupScript]
    num_blocks: int
    scheduler_block_size: int
    hash_block_size: int
    enable_prefix_caching: bool
    retention_interval: Optional[int]
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    long_prefill_token_threshold: int
    scheduling_policy: Literal["fcfs", "priority"]
    watermark: float
    cache_aware_admission_window: Optional[int]
    cache_aware_admission_threshold: Optional[float]
    max_num_inflight_kv_loads: Optional[int]
    prefix_policy: Literal["pr48425", "max_per_group"]
    connector: Optional[Union[ConnectorScript, ReplayScript]]
    requests: list[RequestScript]
    actions: list[ActionScript]
    max_steps: int


class AdmissionTrace(TypedDict):
    request: str
    kind: str
    hits: list[int]
    local: int
    external: int
    hit_diverged: bool
    fallback: bool
    result: Literal["admitted", "no_blocks", "skipped", "crash"]


class KVEventTrace(TypedDict):
    kind: Literal["stored", "removed", "cleared"]
    group: int
    block_id: int
    hash: int


class StepTrace(TypedDict):
    step: int
    scheduled: list[list[Any]]
    preempted: list[str]
    admissions: list[AdmissionTrace]
    kv_events: list[KVEventTrace]


class CrashTrace(TypedDict):
    step: int
    request: Optional[str]
    type: str
    message: str


class ReplayMismatch(TypedDict):
    step: Optional[int]
    message: str


class DecisionTrace(TypedDict):
    steps: list[StepTrace]
    crash: Optional[CrashTrace]
    finished: dict[str, int]
    num_steps: int
    stopped: str
    #: A replayed connector (:class:`ReplayScript`): where vLLM asked what the record does not hold.
    replay_mismatches: NotRequired[list[ReplayMismatch]]


SCRIPT_VERSION = 4
CONNECTOR_CLASS_NAME = "HybridsimScriptedConnector"
REPLAY_CLASS_NAME = "HybridsimReplayConnector"
#: The vLLM releases this harness drives, oldest first.
SUPPORTED_VERSIONS = ("0.33", "0.34")
#: Scheduler keys that exist only from 0.34 on (passed to ``SchedulerConfig`` only when set).
KEYS_034 = ("cache_aware_admission_window", "cache_aware_admission_threshold", "max_num_inflight_kv_loads")

# --------------------------------------------------------------------------- vLLM import


class VllmMissing(RuntimeError):
    """vLLM (or torch) cannot be imported; the message is the import error alone (callers add the remedy)."""


class VersionMismatch(RuntimeError):
    """The installed vLLM is not the release a script was lowered for (message: both, and what to do)."""


def release(version: str) -> str:
    """``"0.34"`` for ``"0.34.0"`` (major.minor, the granularity scenarios name)."""
    return ".".join(version.split(".")[:2])


_VLLM: dict[str, Any] = {}


def vllm_available() -> bool:
    """Whether vLLM can be imported (imports it: about 10 s the first time)."""
    try:
        _load_vllm()
    except VllmMissing:
        return False
    return True


def _load_vllm() -> dict[str, Any]:
    """Import the vLLM pieces once per process (``VLLM_TARGET_DEVICE=cpu`` first)."""
    if _VLLM:
        return _VLLM
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        import torch
        from vllm.config import (
            CacheConfig,
            KVEventsConfig,
            KVTransferConfig,
            ModelConfig,
            SchedulerConfig,
            VllmConfig,
        )
        from vllm.distributed.kv_transfer.kv_connector.v1.base import (
            KVConnectorBase_V1,
            KVConnectorMetadata,
            SupportsHMA,
        )
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256_cbor
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.core.block_pool import BlockHashToBlockMap
        from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import (
            FullAttentionSpec,
            KVCacheConfig,
            KVCacheGroupSpec,
            MambaSpec,
            SlidingWindowSpec,
        )
        from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
        from vllm.v1.request import Request, RequestStatus
        from vllm.v1.structured_output import StructuredOutputManager
    except ImportError as exc:  # pragma: no cover - depends on the machine
        raise VllmMissing(str(exc)) from None
    import vllm

    installed = release(str(getattr(vllm, "__version__", "unknown")))
    if installed not in SUPPORTED_VERSIONS:
        raise VllmMissing(
            f"vLLM {vllm.__version__} is installed; this harness drives {' and '.join(SUPPORTED_VERSIONS)} "
            "(`make vllm-env VLLM=0.34` or `VLLM=0.33`)"
        )
    kv_cache_utils.init_none_hash(sha256_cbor)
    _quiet()
    _VLLM.update(
        release=installed,
        torch=torch,
        CacheConfig=CacheConfig,
        KVEventsConfig=KVEventsConfig,
        KVTransferConfig=KVTransferConfig,
        ModelConfig=ModelConfig,
        SchedulerConfig=SchedulerConfig,
        VllmConfig=VllmConfig,
        KVConnectorBase_V1=KVConnectorBase_V1,
        KVConnectorMetadata=KVConnectorMetadata,
        SupportsHMA=SupportsHMA,
        SamplingParams=SamplingParams,
        sha256_cbor=sha256_cbor,
        kv_cache_utils=kv_cache_utils,
        BlockHashToBlockMap=BlockHashToBlockMap,
        HybridKVCacheCoordinator=HybridKVCacheCoordinator,
        Scheduler=Scheduler,
        FullAttentionSpec=FullAttentionSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        MambaSpec=MambaSpec,
        SlidingWindowSpec=SlidingWindowSpec,
        KVConnectorOutput=KVConnectorOutput,
        ModelRunnerOutput=ModelRunnerOutput,
        Request=Request,
        RequestStatus=RequestStatus,
        StructuredOutputManager=StructuredOutputManager,
    )
    _define_connector()
    return _VLLM


def _quiet() -> None:
    """vLLM's CPU-platform notices (no Triton, block size hints, experimental connector API) are noise here."""
    import logging

    logging.getLogger("vllm").setLevel(logging.ERROR)


def vllm_version() -> str:
    import vllm

    return str(getattr(vllm, "__version__", "unknown"))


def installed_release() -> str:
    """The installed vLLM's release, ``"0.33"`` or ``"0.34"`` (imports vLLM; :class:`VllmMissing` if it cannot)."""
    return str(_load_vllm()["release"])


def check_release(wanted: str) -> None:
    """Raise :class:`VersionMismatch` unless the installed vLLM is release ``wanted``."""
    have = installed_release()
    if have != wanted:
        raise VersionMismatch(
            f"the scenario is for vLLM {wanted} (vllm_version) but vLLM {vllm_version()} is installed: "
            f'install {wanted} (`make vllm-env VLLM={wanted}`), or set vllm_version: "{have}" in the scenario '
            f"(`hybridsim verify --set vllm_version={have}`)"
        )


# --------------------------------------------------------------------------- scripted connector


class _SchedulerRoleOnly:
    """The worker-side hooks of vLLM's ``KVConnectorBase_V1``, which the harness's connectors (scheduler role
    only) are never called on: placed first among their bases, it implements those abstract methods once."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        return None

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return None


def _define_connector() -> None:
    """Define the scripted connector class in this module's namespace.

    vLLM's ``KVConnectorFactory`` loads it by module path (this module's
    ``__name__``) and class name, as any out-of-tree connector.
    """
    v = _VLLM

    class HybridsimScriptedConnector(_SchedulerRoleOnly, v["KVConnectorBase_V1"], v["SupportsHMA"]):  # type: ignore[misc,valid-type,name-defined]
        """hybridsim's ``scripted`` connector (docs/design.md §4), scheduler role only.

        Its script comes in ``kv_connector_extra_config["script"]``. It answers
        ``get_num_new_matched_tokens`` from the script, starts an async load in
        ``update_state_after_alloc`` (``async_load_steps`` steps; the harness
        reports it in ``finished_recving``), holds no KV and never delays a free.
        """

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
            super().__init__(vllm_config, role, kv_cache_config)
            extra = vllm_config.kv_transfer_config.kv_connector_extra_config
            script: ConnectorScript = extra["script"]
            self.script = script
            self.block_size: int = int(extra["scheduler_block_size"])
            self.loading: dict[str, int] = {}
            #: (request id, answer) of the last call, read by the harness.
            self.last_answer: Optional[tuple[str, Optional[int]]] = None

        @property
        def supports_divergent_local_hybrid_hits(self) -> bool:
            return bool(self.script["supports_divergent_local_hybrid_hits"])

        @property
        def requires_kv_delivery(self) -> bool:
            return False

        def _is_async(self, rid: str) -> bool:
            la = self.script["load_async"]
            return bool(la) if isinstance(la, bool) else bool(la.get(rid, False))

        def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[Optional[int], bool]:
            rid = request.request_id
            if rid in self.script["matched_tokens"]:
                ext = int(self.script["matched_tokens"][rid])
            elif rid in self.script["holds"]:
                held = min(int(self.script["holds"][rid]), request.num_tokens - 1)
                held -= held % self.block_size
                ext = max(0, held - num_computed_tokens)
            else:
                ext = 0
            self.last_answer = (rid, ext)
            return ext, ext > 0 and self._is_async(rid)

        def may_load_async(self, request: Any) -> bool:
            """vLLM 0.34: whether this request's load may be asynchronous (its ``load_async`` in the script)."""
            return self._is_async(request.request_id)

        def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
            if num_external_tokens > 0 and self._is_async(request.request_id):
                self.loading[request.request_id] = int(self.script["async_load_steps"])

        def step_finished_recving(self) -> set[str]:
            """Count one step for every load in flight; those done are reported this step."""
            done = set()
            for rid in list(self.loading):
                self.loading[rid] -= 1
                if self.loading[rid] <= 0:
                    del self.loading[rid]
                    done.add(rid)
            return done

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            return v["KVConnectorMetadata"]()

        def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, Optional[dict]]:
            return False, None

        def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, Optional[dict]]:
            return False, None

    HybridsimScriptedConnector.__module__ = __name__
    globals()[CONNECTOR_CLASS_NAME] = HybridsimScriptedConnector

    class HybridsimReplayConnector(_SchedulerRoleOnly, v["KVConnectorBase_V1"], v["SupportsHMA"]):  # type: ignore[misc,valid-type,name-defined]
        """Answers the scheduler with what hybridsim's connector answered it (a :class:`ReplayScript`).

        Each request's ``get_num_new_matched_tokens`` calls get the recorded answers in call order, its
        ``may_load_async`` and ``request_finished_all_groups`` calls likewise, ``has_pending_block_frees``
        the recorded answers in call order. The harness hands the scheduler the recorded
        ``finished_recving`` / ``finished_sending`` sets before the step they were handed over in
        (:meth:`finished_at`). A call the record does not hold (vLLM asks where hybridsim's scheduler did
        not), or one asked at another step or with another local hit, is a difference: it is noted in
        :attr:`mismatches` and answered neutrally (0 tokens, no delay), and the run goes on.
        """

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
            super().__init__(vllm_config, role, kv_cache_config)
            script: ReplayScript = vllm_config.kv_transfer_config.kv_connector_extra_config["script"]
            self.script = script
            self.lookups = {rid: list(calls) for rid, calls in script["lookups"].items()}
            self.asked: dict[str, int] = {}
            self.may = {rid: list(a) for rid, a in script["may_load_async"].items()}
            self.delay = {rid: list(a) for rid, a in script["delay_free"].items()}
            self.pending = list(script["pending_block_frees"])
            self.finished = {int(f[0]): (list(f[1]), list(f[2])) for f in script["finished"]}
            self.runs = [(int(a), int(b)) for a, b in script["steps"]]
            self.ends = [b for _, b in self.runs]
            self.step = 0
            self.loading: dict[str, int] = {}  # the harness's idle rule reads it; replayed loads are not counted
            self.mismatches: list[ReplayMismatch] = []

        def _mismatch(self, message: str, step: Optional[int] = None) -> None:
            self.mismatches.append({"step": self.step if step is None else step, "message": message})

        @property
        def supports_divergent_local_hybrid_hits(self) -> bool:
            return bool(self.script["supports_divergent_local_hybrid_hits"])

        @property
        def requires_kv_delivery(self) -> bool:
            return False

        def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[Optional[int], bool]:
            rid = request.request_id
            n = self.asked.get(rid, 0)
            self.asked[rid] = n + 1
            calls = self.lookups.get(rid, [])
            if n >= len(calls):
                self._mismatch(
                    f"vLLM asked the connector about request {rid} (call {n + 1}, local {num_computed_tokens}); "
                    f"hybridsim's scheduler asked it {len(calls)} times"
                )
                return 0, False
            step, local, ext, load_async = calls[n]
            if step != self.step or local != num_computed_tokens:
                self._mismatch(
                    f"request {rid}, call {n + 1}: vLLM asked at step {self.step} with local {num_computed_tokens}, "
                    f"hybridsim's scheduler at step {step} with local {local}"
                )
            return (None if ext is None else int(ext)), bool(load_async)

        def may_load_async(self, request: Any) -> bool:
            answers = self.may.get(request.request_id)
            if not answers:
                self._mismatch(f"vLLM asked may_load_async for request {request.request_id}; hybridsim's did not")
                return False
            return bool(answers.pop(0))

        def has_pending_block_frees(self) -> bool:
            if not self.pending:
                self._mismatch("vLLM asked has_pending_block_frees more often than hybridsim's scheduler")
                return False
            return bool(self.pending.pop(0))

        def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
            return None

        def finished_at(self, step: int) -> Optional[tuple[list[str], list[str]]]:
            """The recorded ``(finished_recving, finished_sending)`` handed over before step ``step``."""
            return self.finished.get(step)

        def next_step(self, step: int) -> Optional[int]:
            """The first step ``>= step`` that hybridsim's engine ran (``None``: it ran none)."""
            k = bisect.bisect_left(self.ends, step)
            return max(self.runs[k][0], step) if k < len(self.runs) else None

        def last_step(self) -> int:
            return max([b for _, b in self.runs] + list(self.finished) + [0])

        def unused(self) -> None:
            """Note every recorded lookup vLLM never asked for (at the end of the run)."""
            for rid, calls in self.lookups.items():
                n = self.asked.get(rid, 0)
                if n < len(calls):
                    self._mismatch(
                        f"hybridsim's scheduler asked the connector about request {rid} {len(calls)} times, "
                        f"vLLM {n} times",
                        int(calls[n][0]),
                    )

        def step_finished_recving(self) -> set[str]:
            return set()

        def build_connector_meta(self, scheduler_output: Any) -> Any:
            return v["KVConnectorMetadata"]()

        def _finished(self, request: Any) -> tuple[bool, Optional[dict]]:
            answers = self.delay.get(request.request_id)
            if not answers:
                self._mismatch(f"request {request.request_id} finished in vLLM, not in hybridsim")
                return False, None
            return bool(answers.pop(0)), None

        def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, Optional[dict]]:
            return self._finished(request)

        def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, Optional[dict]]:
            return self._finished(request)

    HybridsimReplayConnector.__module__ = __name__
    globals()[REPLAY_CLASS_NAME] = HybridsimReplayConnector


# --------------------------------------------------------------------------- building the scheduler

_MODEL_DIRS: dict[str, str] = {}


def _model_dir(hybrid: bool) -> str:
    """A folder holding only a tiny ``config.json`` (Llama-style, or Jamba-style when hybrid)."""
    key = "hybrid" if hybrid else "attention"
    if key in _MODEL_DIRS and os.path.isdir(_MODEL_DIRS[key]):
        return _MODEL_DIRS[key]
    d = tempfile.mkdtemp(prefix=f"hybridsim-vllm-{key}-")
    common = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "vocab_size": 32000,
        "intermediate_size": 64,
        "max_position_embeddings": 1 << 20,
        "torch_dtype": "float32",
    }
    if hybrid:
        cfg = dict(
            common,
            architectures=["JambaForCausalLM"],
            model_type="jamba",
            num_hidden_layers=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            expert_layer_period=100,
            expert_layer_offset=99,
            num_experts=1,
            mamba_d_state=4,
            mamba_d_conv=2,
            mamba_expand=1,
        )
    else:
        cfg = dict(common, architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=1)
    with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    _MODEL_DIRS[key] = d
    return d


def cleanup_model_dirs() -> None:
    for d in _MODEL_DIRS.values():
        shutil.rmtree(d, ignore_errors=True)
    _MODEL_DIRS.clear()


def _group_spec(g: GroupScript, mamba_mode: str) -> Any:
    v = _VLLM
    torch = v["torch"]
    if g["type"] == "full_attention":
        return v["FullAttentionSpec"](block_size=g["block_size"], num_kv_heads=1, head_size=8, dtype=torch.float32)
    if g["type"] == "sliding_window":
        return v["SlidingWindowSpec"](
            block_size=g["block_size"],
            num_kv_heads=1,
            head_size=8,
            dtype=torch.float32,
            sliding_window=int(g["window"] or 0),
        )
    checkpoints = bool(g["prefill_checkpoints"]) and mamba_mode == "align"
    return v["MambaSpec"](
        block_size=g["block_size"],
        shapes=((4,),),
        dtypes=(torch.float32,),
        mamba_cache_mode=mamba_mode,
        num_prefill_checkpoint_blocks=1 if checkpoints else 0,
        prefill_checkpoint_alignment=1 if checkpoints else None,
    )


@contextlib.contextmanager
def _triton_check_passed() -> Iterator[None]:
    """While a ``VllmConfig`` is built, ``vllm.triton_utils.HAS_TRITON`` reads true (restored after).

    vLLM 0.34's ``CpuPlatform.check_and_update_config`` raises on x86 when
    triton is missing ("vLLM on x86 CPUs requires Triton"), because its model
    runner needs triton-cpu. The harness runs no model: the scheduler and the
    KV-cache manager never read the flag, so the check is passed for the
    config's construction only, instead of installing triton (about 1 GB).
    """
    import vllm.triton_utils as triton_utils

    had = triton_utils.HAS_TRITON
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = had


def build_scheduler(script: LoweredScript) -> Any:
    """vLLM's ``Scheduler`` for ``script``: configs, hand-built ``KVCacheConfig``, connector by module path."""
    v = _load_vllm()
    check_release(script["vllm_version"])
    knobs = {k: script.get(k) for k in KEYS_034 if script.get(k) is not None}
    if knobs and v["release"] == "0.33":
        raise ValueError(f"{', '.join(knobs)}: not in vLLM 0.33")
    hybrid = any(g["type"] == "mamba" for g in script["groups"])
    model_config = v["ModelConfig"](
        model=_model_dir(hybrid), skip_tokenizer_init=True, max_model_len=script["max_model_len"], dtype="float32"
    )
    scheduler_config = v["SchedulerConfig"](
        max_num_seqs=script["max_num_seqs"],
        max_num_batched_tokens=script["max_num_batched_tokens"],
        max_model_len=script["max_model_len"],
        long_prefill_token_threshold=script["long_prefill_token_threshold"],
        enable_chunked_prefill=True,
        policy=script["scheduling_policy"],
        watermark=script["watermark"],
        is_encoder_decoder=False,
        **knobs,
    )
    cache_config = v["CacheConfig"](
        block_size=script["scheduler_block_size"], enable_prefix_caching=script["enable_prefix_caching"]
    )
    kv_transfer = None
    if script["connector"] is not None:
        replay = script["connector"].get("kind") == "replay"
        kv_transfer = v["KVTransferConfig"](
            kv_connector=REPLAY_CLASS_NAME if replay else CONNECTOR_CLASS_NAME,
            kv_connector_module_path=__name__,
            kv_role="kv_both",
            kv_connector_extra_config={
                "script": script["connector"],
                "scheduler_block_size": script["scheduler_block_size"],
            },
        )
    with _triton_check_passed():
        vllm_config = v["VllmConfig"](
            model_config=model_config,
            scheduler_config=scheduler_config,
            cache_config=cache_config,
            kv_transfer_config=kv_transfer,
            kv_events_config=v["KVEventsConfig"](enable_kv_cache_events=True, publisher="null"),
        )
    _quiet()  # building a VllmConfig may configure vLLM's logging again
    mamba_mode = cache_config.mamba_cache_mode if hybrid else "none"
    groups = [v["KVCacheGroupSpec"]([f"layer{i}"], _group_spec(g, mamba_mode)) for i, g in enumerate(script["groups"])]
    kv_cache_config = v["KVCacheConfig"](
        num_blocks=script["num_blocks"],
        kv_cache_tensors=[],
        kv_cache_groups=groups,
        prefix_cache_retention_interval=script["retention_interval"],
        hash_block_size=script["hash_block_size"],
    )
    cache_config.num_gpu_blocks = script["num_blocks"]
    return v["Scheduler"](
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=v["StructuredOutputManager"](vllm_config),
        block_size=script["scheduler_block_size"],
        hash_block_size=script["hash_block_size"],
    )


def _make_request(r: RequestScript, hash_block_size: int) -> Any:
    v = _VLLM
    params = v["SamplingParams"](max_tokens=r["max_tokens"], ignore_eos=True)
    hasher = v["kv_cache_utils"].get_request_block_hasher(hash_block_size, v["sha256_cbor"])
    return v["Request"](
        request_id=r["id"],
        prompt_token_ids=list(r["prompt_token_ids"]),
        sampling_params=params,
        pooling_params=None,
        arrival_time=float(r["arrival_step"]),
        priority=r["priority"],
        block_hasher=hasher,
    )


# --------------------------------------------------------------------------- the pre-#48425 lookup


def _install_max_per_group(scheduler: Any) -> None:
    """Emulate the pre-#48425 local lookup (``max_per_group``) on this scheduler instance.

    What vLLM did before PR #48425: with a connector attached, Mamba layers and
    the hybrid coordinator (no capability flag), the local hit is the maximum
    of ``find_longest_cache_hit_per_group``, each group claiming its own
    per-group blocks; no shared-prefix boundary (0) and never ``hit_diverged``.
    Otherwise the plain ``get_computed_blocks``. Everything else in
    ``schedule()`` stays 0.33's, so this answers "what would 0.33 do with the
    old lookup". Not vLLM 0.33 as shipped.
    """
    v = _VLLM
    kvm = scheduler.kv_cache_manager
    coordinator = kvm.coordinator

    def lookup(request: Any, max_cache_hit_length: Optional[int] = None) -> tuple[Any, int, int, bool]:
        gated = (
            scheduler.connector is not None
            and kvm.kv_cache_config.has_mamba_layers
            and isinstance(coordinator, v["HybridKVCacheCoordinator"])
        )
        if not gated:
            blocks, num_local, boundary = kvm.get_computed_blocks(request, max_cache_hit_length)
            return blocks, num_local, boundary, False
        if not kvm.prefix_cache_lookup_enabled(request):
            return kvm.empty_kv_cache_blocks, 0, 0, False
        limit = request.num_tokens - 1 if max_cache_hit_length is None else max_cache_hit_length
        computed, hits = coordinator.find_longest_cache_hit_per_group(request.block_hashes, limit)
        return kvm.create_kv_cache_blocks(computed), max(hits), 0, False

    scheduler._get_local_prefix_cache_hit = lookup


# --------------------------------------------------------------------------- the recording harness


def _crash_message(exc: BaseException) -> str:
    text = str(exc)
    if text or not isinstance(exc, AssertionError):
        return text
    frames = traceback.extract_tb(exc.__traceback__)
    line = (frames[-1].line or "").strip() if frames else ""
    return line[len("assert ") :].split(",")[0].strip() if line.startswith("assert ") else line


class _Recorder:
    """Wraps methods of one scheduler instance to observe its decisions."""

    def __init__(self, scheduler: Any, record: bool) -> None:
        self.s = scheduler
        self.record = record
        self.num_groups = len(scheduler.kv_cache_config.kv_cache_groups)
        self.admissions: list[AdmissionTrace] = []
        self.open: Optional[AdmissionTrace] = None
        self.preempted: list[str] = []
        self.events: list[KVEventTrace] = []
        self.hash_ids: dict[bytes, int] = {}
        self.in_lookup = False
        self.current: Optional[str] = None
        if record:
            self._wrap()

    # -- helpers
    def _hits(self, request: Any) -> list[int]:
        v = _VLLM
        kvm = self.s.kv_cache_manager
        coord = kvm.coordinator
        if not kvm.prefix_cache_lookup_enabled(request):
            return [0] * self.num_groups
        limit = request.num_tokens - 1
        if isinstance(coord, v["HybridKVCacheCoordinator"]):
            return list(coord.find_longest_cache_hit_per_group(request.block_hashes, limit)[1])
        return [int(coord.find_longest_cache_hit(request.block_hashes, limit)[1])] * self.num_groups

    def _kind(self, request: Any) -> str:
        if request.num_computed_tokens > 0:
            return "after_async_load"
        return "after_preemption" if request.num_preemptions else "first"

    def close_open(self, result: str) -> None:
        if self.open is not None:
            self.open["result"] = result  # type: ignore[typeddict-item]
            self.admissions.append(self.open)
            self.open = None

    def _start(self, request: Any) -> AdmissionTrace:
        self.close_open("skipped")
        att: AdmissionTrace = {
            "request": request.request_id,
            "kind": self._kind(request),
            "hits": [0] * self.num_groups,
            "local": 0,
            "external": 0,
            "hit_diverged": False,
            "fallback": False,
            "result": "skipped",
        }
        self.open = att
        return att

    def _hash_id(self, key: Any) -> int:
        from vllm.v1.core.kv_cache_utils import get_block_hash

        h = bytes(get_block_hash(key))
        if h not in self.hash_ids:
            self.hash_ids[h] = len(self.hash_ids)
        return self.hash_ids[h]

    # -- wrapping
    def _wrap(self) -> None:
        s = self.s
        kvm = s.kv_cache_manager
        rec = self

        orig_lookup = s._get_local_prefix_cache_hit

        def lookup(request: Any, max_cache_hit_length: Optional[int] = None) -> Any:
            rec.current = request.request_id
            att = rec._start(request)
            att["hits"] = rec._hits(request)
            rec.in_lookup = True
            try:
                out = orig_lookup(request, max_cache_hit_length)
            finally:
                rec.in_lookup = False
            att["local"] = int(out[1])
            att["hit_diverged"] = bool(out[3])
            return out

        s._get_local_prefix_cache_hit = lookup

        orig_gcb = kvm.get_computed_blocks

        def get_computed_blocks(request: Any, max_cache_hit_length: Optional[int] = None) -> Any:
            out = orig_gcb(request, max_cache_hit_length)
            att = rec.open
            if not rec.in_lookup and att is not None and att["request"] == request.request_id:
                att["fallback"] = True
                att["local"] = int(out[1])
            return out

        kvm.get_computed_blocks = get_computed_blocks

        orig_alloc = kvm.allocate_slots
        running = _VLLM["RequestStatus"].RUNNING

        def allocate_slots(request: Any, num_new_tokens: int, *args: Any, **kwargs: Any) -> Any:
            rec.current = request.request_id
            if request.status == running:
                return orig_alloc(request, num_new_tokens, *args, **kwargs)
            att = rec.open
            if att is None or att["request"] != request.request_id:
                att = rec._start(request)
            att["local"] = int(kwargs.get("num_new_computed_tokens", 0))
            att["external"] = int(kwargs.get("num_external_computed_tokens", 0))
            try:
                out = orig_alloc(request, num_new_tokens, *args, **kwargs)
            except BaseException:
                rec.close_open("crash")
                raise
            rec.close_open("no_blocks" if out is None else "admitted")
            return out

        kvm.allocate_slots = allocate_slots

        # An admission that stops at the Mamba block-aligned split (no aligned chunk fits the budget) calls
        # neither the lookup nor allocate_slots when the request resumes after an async load: open its
        # attempt here (a running request's split is not an admission).
        orig_split = s._mamba_block_aligned_split

        def split(request: Any, *args: Any, **kwargs: Any) -> Any:
            if request.status != running and (rec.open is None or rec.open["request"] != request.request_id):
                rec.current = request.request_id
                rec._start(request)
            return orig_split(request, *args, **kwargs)

        s._mamba_block_aligned_split = split

        orig_preempt = s._preempt_request

        def preempt(request: Any, *args: Any, **kwargs: Any) -> Any:
            rec.preempted.append(request.request_id)
            return orig_preempt(request, *args, **kwargs)

        s._preempt_request = preempt

        if s.connector is not None:
            conn = s.connector
            orig_match = conn.get_num_new_matched_tokens

            def match(request: Any, num_computed_tokens: int) -> Any:
                rec.current = request.request_id
                ext, load_async = orig_match(request, num_computed_tokens)
                att = rec.open
                if att is not None and att["request"] == request.request_id:
                    # 0.33: skip_reading_prefix_cache; 0.34: skip_reading_external_kv (a hit-limited request).
                    skip = getattr(request, "skip_reading_external_kv", None)
                    if skip is None:
                        skip = request.skip_reading_prefix_cache
                    att["external"] = 0 if (ext is None or skip) else int(ext)
                return ext, load_async

            conn.get_num_new_matched_tokens = match

        self._wrap_pool()

    def _wrap_pool(self) -> None:
        pool = self.s.kv_cache_manager.block_pool
        rec = self
        from vllm.v1.core.kv_cache_utils import get_group_id

        class RecordingMap(_VLLM["BlockHashToBlockMap"]):  # type: ignore[misc,valid-type,name-defined]
            def insert(self, key: Any, block: Any) -> None:
                super().insert(key, block)
                rec.events.append(
                    {
                        "kind": "stored",
                        "group": int(get_group_id(key)),
                        "block_id": int(block.block_id),
                        "hash": rec._hash_id(key),
                    }
                )

            def pop(self, key: Any, block_id: int) -> Any:
                out = super().pop(key, block_id)
                if out is not None:
                    rec.events.append(
                        {
                            "kind": "removed",
                            "group": int(get_group_id(key)),
                            "block_id": int(block_id),
                            "hash": rec._hash_id(key),
                        }
                    )
                return out

        def install() -> None:
            # 0.34's map holds block ids and is built with the pool's blocks; 0.33's takes nothing.
            fresh = RecordingMap(pool.blocks) if _VLLM["release"] != "0.33" else RecordingMap()
            old = pool.cached_block_hash_to_block
            assert len(old) == 0, "the block map is replaced only while empty"
            pool.cached_block_hash_to_block = fresh

        install()
        orig_reset = pool.reset_prefix_cache

        def reset_prefix_cache() -> bool:
            ok = orig_reset()
            if ok:
                install()
                rec.events.append({"kind": "cleared", "group": -1, "block_id": -1, "hash": -1})
            return ok

        pool.reset_prefix_cache = reset_prefix_cache

    def take_step(self, step: int, scheduled: list[list[Any]]) -> Optional[StepTrace]:
        self.close_open("skipped")
        trace: StepTrace = {
            "step": step,
            "scheduled": scheduled,
            "preempted": self.preempted,
            "admissions": self.admissions,
            "kv_events": self.events,
        }
        self.preempted, self.admissions, self.events = [], [], []
        if scheduled or trace["preempted"] or trace["admissions"] or trace["kv_events"]:
            return trace
        return None


def _apply_action(scheduler: Any, action: ActionScript, prompts: dict[str, Any], script: LoweredScript) -> None:
    """Apply one action through vLLM's own calls (``reset_prefix_cache``, ``evict_blocks``)."""
    kvm = scheduler.kv_cache_manager
    if action["kind"] == "reset_prefix_cache":
        kvm.reset_prefix_cache()
        return
    from vllm.v1.core.kv_cache_utils import make_block_hash_with_group_id

    request = prompts[action["request"]]
    fine = request.block_hashes
    block_map = kvm.block_pool.cached_block_hash_to_block
    # Every block cached under each named hash, group by group, in the order of
    # the action's blocks, then by ascending block id; evict_blocks iterates
    # what it is given, so it gets this order (a list, not a set).
    ids: dict[int, None] = {}
    for group in action["groups"]:
        group_bs = script["groups"][group]["block_size"]
        if group_bs % script["hash_block_size"]:
            continue  # no hash at this group's granularity (e.g. caching off): nothing cached
        ratio = group_bs // script["hash_block_size"]
        for i in action["block_indices"]:
            j = (i + 1) * ratio - 1
            if j >= len(fine):
                continue
            ids.update(
                dict.fromkeys(sorted(_cached_block_ids(block_map, make_block_hash_with_group_id(fine[j], group))))
            )
    if ids:
        kvm.evict_blocks(list(ids))


def _cached_block_ids(block_map: Any, key: Any) -> list[int]:
    """Ids of every block cached under ``key`` (0.33: a block or ``{id: block}``; 0.34: an id, dups apart)."""
    entry = block_map._cache.get(key)
    if entry is None:
        return []
    if isinstance(entry, int):
        dups = block_map._dup_ids.get(key)
        return [int(b) for b in dups] if dups is not None else [entry]
    return [int(b) for b in entry] if isinstance(entry, dict) else [int(entry.block_id)]


def run_script(script: LoweredScript, record: bool = True) -> DecisionTrace:
    """Step vLLM's scheduler through ``script``; the decision trace (empty ``steps`` when ``record=False``)."""
    v = _load_vllm()
    if script.get("version") != SCRIPT_VERSION:
        raise ValueError(f"lowered script version {script.get('version')!r}, expected {SCRIPT_VERSION}")
    scheduler = build_scheduler(script)
    if script["prefix_policy"] == "max_per_group":
        _install_max_per_group(scheduler)
    elif script["prefix_policy"] != "pr48425":
        raise ValueError(f"prefix_policy {script['prefix_policy']!r} is not verifiable (pr48425, max_per_group)")
    rec = _Recorder(scheduler, record)
    arrivals: dict[int, list[RequestScript]] = {}
    for r in script["requests"]:
        arrivals.setdefault(int(r["arrival_step"]), []).append(r)
    actions: dict[int, list[ActionScript]] = {}
    for a in script["actions"]:
        actions.setdefault(int(a["at_step"]), []).append(a)
    # Prompt-only requests for the evict actions' hashes (as hybridsim: from the prompt content); only
    # the requests an action names (hashing every prompt twice would be work hybridsim does not do).
    named = {a["request"] for a in script["actions"] if a["kind"] == "evict"}
    prompts = {r["id"]: _make_request(r, script["hash_block_size"]) for r in script["requests"] if r["id"] in named}
    bases = {r["id"]: int(r["output_token_base"]) for r in script["requests"]}
    connector = scheduler.connector
    replay = connector if script["connector"] is not None and script["connector"].get("kind") == "replay" else None
    last_event = max([*arrivals, *actions, replay.last_step() if replay is not None else 0], default=0)
    steps: list[StepTrace] = []
    crash: Optional[CrashTrace] = None
    finished: dict[str, int] = {}
    generated: dict[str, int] = {}
    stopped = ""
    step = 0
    # 0.33's ModelRunnerOutput maps request ids to rows; 0.34 reads the rows in req_ids order.
    by_index = v["release"] == "0.33"
    while True:
        if step >= script["max_steps"]:
            stopped = "max_steps"
            break
        if step > last_event and not scheduler.has_requests():
            break
        if replay is not None:
            replay.step = step
        try:
            for a in actions.get(step, ()):
                _apply_action(scheduler, a, prompts, script)
            for r in arrivals.get(step, ()):
                scheduler.add_request(_make_request(r, script["hash_block_size"]))
            if replay is not None:
                done = replay.finished_at(step)
                if done is not None:
                    # What hybridsim's engine handed its scheduler before this step's schedule(), through
                    # vLLM's own handler, in hybridsim's (sorted) order: lists, not sets, so the frees are
                    # made in one order whatever the process's string hashing.
                    scheduler._update_from_kv_xfer_finished(
                        v["KVConnectorOutput"](finished_recving=done[0], finished_sending=done[1])
                    )
            out = scheduler.schedule()
            scheduled = [[rid, int(n)] for rid, n in out.num_scheduled_tokens.items()]
            rec.current = None
            sampled: list[list[int]] = []
            req_ids: list[str] = []
            for rid in out.num_scheduled_tokens:
                req = scheduler.requests[rid]
                req_ids.append(rid)
                if req.num_computed_tokens >= req.num_tokens:
                    sampled.append([bases[rid] + req.num_output_tokens])
                else:
                    sampled.append([])
            recving = connector.step_finished_recving() if connector is not None else set()
            index = {"req_id_to_index": {rid: i for i, rid in enumerate(req_ids)}} if by_index else {}
            mro = v["ModelRunnerOutput"](
                req_ids=req_ids,
                sampled_token_ids=sampled,
                kv_connector_output=v["KVConnectorOutput"](finished_recving=recving) if recving else None,
                **index,
            )
            engine_out = scheduler.update_from_output(out, mro)
            for rid, tokens in zip(req_ids, sampled):
                generated[rid] = generated.get(rid, 0) + len(tokens)
            for outs in engine_out.values():
                for o in outs.outputs:
                    if o.finish_reason is not None:
                        finished[o.request_id] = generated.get(o.request_id, 0)
            scheduler.kv_cache_manager.take_events()
        except (AssertionError, ValueError) as exc:
            rec.close_open("crash")
            crash = {"step": step, "request": rec.current, "type": type(exc).__name__, "message": _crash_message(exc)}
            trace = rec.take_step(step, [])
            if trace is not None:
                steps.append(trace)
            stopped = "crash"
            break
        trace = rec.take_step(step, scheduled)
        if record and trace is not None:
            steps.append(trace)
        step += 1
        idle = not out.num_scheduled_tokens and not out.preempted_req_ids
        if idle and not recving and not (connector is not None and connector.loading):
            # Nothing ran, nothing is loading or just loaded: the next steps would repeat this one
            # until an arrival or an action changes something, so go there (as
            # hybridsim's engine sleeps); with none left, requests that remain are stuck.
            # A replayed connector's answers change with its transfers, which wake hybridsim's engine:
            # go to the next step it ran.
            future = [k for k in (*arrivals, *actions) if k >= step]
            if replay is not None:
                woke = replay.next_step(step)
                future += [] if woke is None else [woke]
            if not future:
                if scheduler.has_requests():
                    stopped = "stalled"
                break
            step = min(future)
    result: DecisionTrace = {
        "steps": steps,
        "crash": crash,
        "finished": finished,
        "num_steps": step,
        "stopped": stopped,
    }
    if replay is not None:
        if not crash and stopped != "max_steps":
            replay.unused()
        result["replay_mismatches"] = list(replay.mismatches)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    """``python vllm_side.py SCRIPT.json``: print the decision trace as JSON."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: vllm_side.py LOWERED_SCRIPT.json", file=sys.stderr)
        return 2
    with open(args[0], encoding="utf-8") as fh:
        script = json.load(fh)
    print(json.dumps(run_script(script), indent=1))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
