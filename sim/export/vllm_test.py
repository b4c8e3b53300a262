"""``hybridsim export vllm-test``: a self-contained pytest module that replays a step-clock scenario in vLLM.

The written file has three parts:

1. leading comments: where it came from and how to run it;
2. :mod:`sim.verify.vllm_side`, verbatim (read with :func:`inspect.getsource`):
   the harness ``hybridsim verify`` runs, which builds vLLM 0.33's
   ``Scheduler`` + ``KVCacheManager`` as vLLM's scheduler tests do (hand-built
   ``KVCacheConfig``, fabricated model output, a scripted connector written
   against ``KVConnectorBase_V1`` and loaded by vLLM's factory);
3. the test: the lowered script (:mod:`sim.verify.lower`) as a readable
   literal (one constant per token stream, named requests, one comment per
   evicted block), the expectation stated once (``EXPECTED``: what hybridsim
   observed, i.e. the crash with its step, request, type and message, and
   every admission attempt with its per-group hits, local and external tokens,
   ``hit_diverged``, fallback and result), and one test function that runs the
   script and compares.

It needs only ``vllm`` (and pytest) installed; it never imports ``sim``. The
expectation is hybridsim's, so the test passes exactly when vLLM agrees with
hybridsim on this scenario (``hybridsim verify`` says ``identical``).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import sim
from sim.config.scenario import Scenario
from sim.core.tokens import OUTPUT_STREAM_PREFIX, StreamSegment, basic_segments
from sim.engine.build import build_components
from sim.verify import vllm_side
from sim.verify.lower import TOKEN_STRIDE, lower, not_verifiable_reason
from sim.verify.run import hybridsim_trace
from sim.verify.vllm_side import DecisionTrace, LoweredScript

ADMISSION_FIELDS = ("step", "request", "kind", "hits", "local", "external", "hit_diverged", "fallback", "result")


class ExportError(ValueError):
    """The scenario cannot be exported (not verifiable against vLLM)."""


def _identifier(name: str, taken: set[str]) -> str:
    base = re.sub(r"\W+", "_", name).strip("_").upper() or "STREAM"
    ident = base if base[0].isalpha() else f"S_{base}"
    candidate, n = ident, 2
    while candidate in taken:
        candidate, n = f"{ident}_{n}", n + 1
    taken.add(candidate)
    return candidate


class _Streams:
    """Names the token streams of the lowered prompts: one constant per stream base."""

    def __init__(self) -> None:
        self.names: dict[int, tuple[str, str]] = {}  # base -> (constant, what it is)
        self._taken: set[str] = {"TOKEN_STRIDE", "SCRIPT", "EXPECTED"}

    def name(self, base: int, label: str) -> str:
        if base not in self.names:
            self.names[base] = (_identifier(label, self._taken), label)
        return self.names[base][0]


def _prompt_expr(ids: list[int], segments: tuple, streams: _Streams) -> tuple[str, str]:
    """Python for a prompt's token ids (``tokens(STREAM, start, n) + ...``) and a one-line description."""
    parts, labels, pos = [], [], 0
    for seg in segments:
        n = seg.length
        if n == 0:
            continue
        chunk = ids[pos : pos + n]
        pos += n
        if isinstance(seg, StreamSegment) and chunk == list(range(chunk[0], chunk[0] + n)):
            base = chunk[0] - chunk[0] % TOKEN_STRIDE
            if seg.stream.startswith(OUTPUT_STREAM_PREFIX):
                label = f"output of {seg.stream[len(OUTPUT_STREAM_PREFIX) :]}"
            else:
                label = seg.stream
            const = streams.name(base, label if not label.startswith("output of ") else "OUTPUT_OF_" + label[10:])
            parts.append(f"tokens({const}, {chunk[0] - base}, {n})")
            labels.append(f"{label}[{chunk[0] - base}:{chunk[0] - base + n}]")
        else:
            parts.append(repr(chunk))
            labels.append(f"{n} explicit ids")
    return " + ".join(parts), " + ".join(labels)


def _script_source(script: LoweredScript, scenario: Scenario, segments: dict[str, tuple]) -> tuple[str, str]:
    """(stream constants, ``SCRIPT = {...}``) as readable Python."""
    streams = _Streams()
    request_lines = []
    for r in script["requests"]:
        expr, label = _prompt_expr(r["prompt_token_ids"], segments[r["id"]], streams)
        base = r["output_token_base"] // TOKEN_STRIDE
        request_lines.append(
            f"        # {r['id']}: {label} ({len(r['prompt_token_ids'])} tokens), added before step "
            f"{r['arrival_step']}, {r['max_tokens']} output token{'s' if r['max_tokens'] > 1 else ''}\n"
            f"        {{'id': {r['id']!r}, 'arrival_step': {r['arrival_step']}, 'prompt_token_ids': {expr},\n"
            f"         'max_tokens': {r['max_tokens']}, 'priority': {r['priority']}, "
            f"'output_token_base': {base} * TOKEN_STRIDE}},"
        )
    action_lines = []
    for a in script["actions"]:
        if a["kind"] == "evict":
            for gi in a["groups"]:
                g = script["groups"][gi]
                size = g["block_size"]
                blocks = ", ".join(f"block {i} (tokens {i * size}-{(i + 1) * size - 1})" for i in a["block_indices"])
                action_lines.append(
                    f"        # before step {a['at_step']}: evict {a['request']}'s prompt {blocks} "
                    f"from group {gi} ({g['type']})"
                )
        else:
            action_lines.append(f"        # before step {a['at_step']}: reset the prefix cache")
        action_lines.append(f"        {a!r},")
    skip = {"requests", "actions", "groups", "connector"}
    head = [f"    {k!r}: {v!r}," for k, v in script.items() if k not in skip]
    groups = [f"        {g!r}," for g in script["groups"]]
    connector = repr(script["connector"])
    body = "\n".join(
        [
            "SCRIPT = {",
            *head,
            "    # KV-cache groups in group order (block 0 of the shared pool is the null block)",
            "    'groups': [",
            *groups,
            "    ],",
            f"    'connector': {connector},",
            "    'requests': [",
            *request_lines,
            "    ],",
            *(["    'actions': [", *action_lines, "    ],"] if action_lines else ["    'actions': [],"]),
            "}",
        ]
    )
    consts = [
        f"{name} = {base // TOKEN_STRIDE} * TOKEN_STRIDE  # {label}"
        for base, (name, label) in sorted(streams.names.items())
    ]
    return "\n".join(consts), body


def expectation(trace: DecisionTrace) -> dict[str, Any]:
    """What the test asserts: the crash (or ``None``) and every admission attempt, as plain tuples."""
    admissions = [
        (
            s["step"],
            a["request"],
            a["kind"],
            list(a["hits"]),
            a["local"],
            a["external"],
            bool(a["hit_diverged"]),
            bool(a["fallback"]),
            a["result"],
        )
        for s in trace["steps"]
        for a in s["admissions"]
    ]
    return {"crash": trace["crash"], "admissions": admissions}


def _expected_source(expected: dict[str, Any]) -> str:
    crash = expected["crash"]
    lines = ["EXPECTED = {"]
    if crash is None:
        lines.append("    # no crash: the run ends when every request has finished")
    else:
        lines.append(f"    # vLLM's engine dies at step {crash['step']} while handling {crash['request']}")
    lines.append(f"    'crash': {crash!r},")
    lines.append(f"    # every admission attempt: {ADMISSION_FIELDS}")
    lines.append("    'admissions': [")
    lines.extend(f"        {row!r}," for row in expected["admissions"])
    lines.append("    ],")
    lines.append("}")
    return "\n".join(lines)


_TEST_PART = '''

# ============================================================================ the exported test
# Everything above is hybridsim's vLLM harness (sim/verify/vllm_side.py), verbatim.

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

TOKEN_STRIDE = 1 << 24


def tokens(stream: int, start: int, n: int) -> list[int]:
    """Tokens [start, start + n) of a stream: equal content gives equal ids, so prompts share prefix blocks."""
    return list(range(stream + start, stream + start + n))


{consts}

{script}

{expected}


def _observed(trace: dict) -> dict:
    admissions = [
        (s["step"], a["request"], a["kind"], list(a["hits"]), a["local"], a["external"], bool(a["hit_diverged"]),
         bool(a["fallback"]), a["result"])
        for s in trace["steps"] for a in s["admissions"]
    ]
    return {{"crash": trace["crash"], "admissions": admissions}}


def test_{func}() -> None:
    """{doc}"""
    try:
        observed = _observed(run_script(SCRIPT))
    finally:
        cleanup_model_dirs()
    assert observed["crash"] == EXPECTED["crash"]
    assert observed["admissions"] == EXPECTED["admissions"]
'''


def export_vllm_test(scenario: Scenario, source: str) -> str:
    """The pytest module for ``scenario`` (:class:`ExportError` if it cannot be run through vLLM)."""
    reason = not_verifiable_reason(scenario)
    if reason is not None:
        raise ExportError(f"{source}: cannot export a vLLM test: {reason}")
    components = build_components(scenario)
    assert components is not None  # None only for a dry run
    segments = {r.request_id: basic_segments(r.prompt) for r in components.requests}
    script = lower(scenario, components)
    expected = expectation(hybridsim_trace(scenario, script["max_steps"]))
    consts, script_src = _script_source(script, scenario, segments)
    crash = expected["crash"]
    if crash is not None:
        what = f"vLLM raises {crash['type']}: {crash['message']} at step {crash['step']} (request {crash['request']})"
    else:
        what = f"vLLM makes the same {len(expected['admissions'])} admission decisions as hybridsim"
    func = re.sub(r"\W+", "_", scenario.name).strip("_").lower() or "scenario"
    header = "".join(
        f"# {line}\n"
        for line in [
            f"Exported by `hybridsim export vllm-test` (hybridsim {sim.__version__}) from {source}.",
            f"Scenario {scenario.name!r}: {what}.",
            "Self-contained: needs only vllm 0.33 and pytest. Run: VLLM_TARGET_DEVICE=cpu python -m pytest THIS_FILE",
            "The test itself is at the end of the file (after the harness): SCRIPT, EXPECTED, test_" + func + ".",
        ]
    )
    harness = inspect.getsource(vllm_side)
    return (
        header
        + harness
        + _TEST_PART.format(
            consts=consts,
            script=script_src,
            expected=_expected_source(expected),
            func=func,
            doc=f"{what[0].upper()}{what[1:]}.",
        )
    )
