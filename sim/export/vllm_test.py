"""``hybridsim export vllm-test``: a self-contained pytest module that replays a step-clock scenario in vLLM.

Generated code is data plus fixed code. The written file has three parts:

1. a fixed comment header (how to run it; where to read what it asserts);
2. :mod:`sim.verify.vllm_side`, verbatim (read with :func:`inspect.getsource`):
   the harness ``hybridsim verify`` runs, which builds vLLM's (0.33 or 0.34)
   ``Scheduler`` + ``KVCacheManager`` as vLLM's scheduler tests do (hand-built
   ``KVCacheConfig``, fabricated model output, a scripted connector written
   against ``KVConnectorBase_V1`` and loaded by vLLM's factory);
3. the test: ``CASE = json.loads(...)``, ONE string literal holding the case as
   a JSON document (:func:`case`), followed by fixed code
   (:data:`TEST_CODE`, and :data:`CONTRAST_TEST_CODE` when there is a contrast)
   that reads it.

Every scenario string (request ids, content labels, the scenario's name, the
source path, a crash message) lives only inside that JSON document, which is
written with every non-ASCII and control character escaped and then quoted
with :func:`repr`: no user string is ever part of the code, a comment, a
docstring, a test name or an identifier, so any name gives a file that parses
and runs nothing but the fixed code.

The JSON document (``format`` 1): ``exported_by``, ``source``, ``scenario``,
``asserts`` (what the tests assert, in words), ``streams`` (each content
stream's label and first token id, to read the prompts), ``script`` (the
lowered script of :mod:`sim.verify.lower`, each prompt as ``prompt_runs``:
``[first_id, length]`` runs of consecutive token ids), ``notes`` (one line per
request and action, for the reader), ``expected`` (what hybridsim observed:
the crash or ``None``, and every admission attempt as
:data:`ADMISSION_FIELDS`) and ``contrast``: ``None``, or, when the scenario
crashes under ``max_per_group`` and runs clean under ``pr48425``, that
policy, the script keys that change, and hybridsim's expectation there (the
second test asserts both that vLLM runs it clean and makes those decisions).

It needs only ``vllm`` (and pytest) installed; it never imports ``sim``. The
expectation is hybridsim's, so the test passes exactly when vLLM agrees with
hybridsim on this scenario (``hybridsim verify`` says ``identical``).
"""

from __future__ import annotations

import inspect
import json
import warnings
from pathlib import Path
from typing import Any

import sim
from sim.config.scenario import Scenario
from sim.core.tokens import OUTPUT_STREAM_PREFIX, StreamSegment, basic_segments
from sim.engine.build import CapacityWarning, build_components
from sim.shrink.probe import under_policy
from sim.shrink.property import DEFAULT_CONTRAST
from sim.verify import vllm_side
from sim.verify.lower import lower, not_verifiable_reason
from sim.verify.run import hybridsim_trace
from sim.verify.vllm_side import DecisionTrace, LoweredScript

ADMISSION_FIELDS = ("step", "request", "kind", "hits", "local", "external", "hit_diverged", "fallback", "result")
#: The policy a crash under another policy is contrasted with: vLLM as shipped (#48425 merged).
CONTRAST_POLICY = DEFAULT_CONTRAST
CASE_FORMAT = 1


class ExportError(ValueError):
    """The scenario cannot be exported (not verifiable against vLLM)."""


# ------------------------------------------------------------------ the data


def expectation(trace: DecisionTrace) -> dict[str, Any]:
    """What a test asserts: the crash (or ``None``) and every admission attempt, as JSON lists."""
    admissions = [
        [
            s["step"],
            a["request"],
            a["kind"],
            list(a["hits"]),
            a["local"],
            a["external"],
            bool(a["hit_diverged"]),
            bool(a["fallback"]),
            a["result"],
        ]
        for s in trace["steps"]
        for a in s["admissions"]
    ]
    return {"crash": trace["crash"], "admissions": admissions}


def prompt_runs(ids: list[int]) -> list[list[int]]:
    """``ids`` as ``[first, length]`` runs of consecutive ids (the fixed code expands them back)."""
    runs: list[list[int]] = []
    for token in ids:
        if runs and runs[-1][0] + runs[-1][1] == token:
            runs[-1][1] += 1
        else:
            runs.append([token, 1])
    return runs


def _stream_label(stream: str) -> str:
    if stream.startswith(OUTPUT_STREAM_PREFIX):
        return f"output of {stream[len(OUTPUT_STREAM_PREFIX) :]}"
    return stream


def _request_note(r: dict, segments: tuple, streams: dict[int, str]) -> str:
    parts, pos, ids = [], 0, r["prompt_token_ids"]
    for seg in segments:
        if seg.length == 0:
            continue
        chunk = ids[pos : pos + seg.length]
        pos += seg.length
        if isinstance(seg, StreamSegment) and chunk == list(range(chunk[0], chunk[0] + len(chunk))):
            base = chunk[0] - seg.start  # a stream's position p is lowered to its first id + p
            streams.setdefault(base, _stream_label(seg.stream))
            parts.append(f"{streams[base]}[{chunk[0] - base}:{chunk[0] - base + len(chunk)}]")
        else:
            parts.append(f"{len(chunk)} explicit ids")
    n = r["max_tokens"]
    return (
        f"{r['id']}: {' + '.join(parts)} ({len(ids)} tokens), added before step {r['arrival_step']}, "
        f"{n} output token{'s' if n != 1 else ''}"
    )


def _action_note(a: dict, script: LoweredScript) -> str:
    if a["kind"] != "evict":
        return f"before step {a['at_step']}: reset the prefix cache"
    notes = []
    for gi in a["groups"]:
        g = script["groups"][gi]
        size = g["block_size"]
        blocks = ", ".join(f"block {i} (tokens {i * size}-{(i + 1) * size - 1})" for i in a["block_indices"])
        notes.append(f"{blocks} from group {gi} ({g['type']})")
    return f"before step {a['at_step']}: evict {a['request']}'s prompt {'; '.join(notes)}"


def _compact_script(script: LoweredScript) -> dict[str, Any]:
    out: dict[str, Any] = dict(script)
    out["requests"] = [
        {**{k: v for k, v in r.items() if k != "prompt_token_ids"}, "prompt_runs": prompt_runs(r["prompt_token_ids"])}
        for r in script["requests"]
    ]
    return out


def _what(expected: dict[str, Any]) -> str:
    crash = expected["crash"]
    if crash is None:
        return f"vLLM makes the same {len(expected['admissions'])} admission decisions as hybridsim"
    return f"vLLM raises {crash['type']}: {crash['message']} at step {crash['step']} (request {crash['request']})"


def _contrast(scenario: Scenario, script: LoweredScript, expected: dict[str, Any]) -> dict[str, Any] | None:
    """The clean side of a crash the prefix policy causes (``None`` when there is no such contrast)."""
    if expected["crash"] is None or scenario.scheduler.prefix_policy == CONTRAST_POLICY:
        return None
    other = under_policy(scenario, CONTRAST_POLICY)
    other_script = lower(other)
    other_expected = expectation(hybridsim_trace(other, other_script["max_steps"]))
    if other_expected["crash"] is not None:
        return None
    ours, theirs = _compact_script(script), _compact_script(other_script)
    return {
        "policy": CONTRAST_POLICY,
        "script": {k: v for k, v in theirs.items() if ours.get(k) != v},
        "expected": other_expected,
    }


def case(scenario: Scenario, source: str) -> dict[str, Any]:
    """The JSON document the exported module embeds (see the module docstring)."""
    reason = not_verifiable_reason(scenario)
    if reason is not None:
        raise ExportError(f"{source}: cannot export a vLLM test: {reason}")
    components = build_components(scenario)
    assert components is not None  # None only for a dry run
    segments = {r.request_id: basic_segments(r.prompt) for r in components.requests}
    script = lower(scenario, components)
    with warnings.catch_warnings():  # the build above showed it, if any
        warnings.simplefilter("ignore", CapacityWarning)
        expected = expectation(hybridsim_trace(scenario, script["max_steps"]))
        contrast = _contrast(scenario, script, expected)
    streams: dict[int, str] = {}
    request_notes = [_request_note(dict(r), segments[r["id"]], streams) for r in script["requests"]]
    asserts = [f"under prefix_policy {script['prefix_policy']}: {_what(expected)}"]
    if contrast is not None:
        asserts.append(f"under prefix_policy {contrast['policy']}: no crash, {_what(contrast['expected'])}")
    return {
        "format": CASE_FORMAT,
        "exported_by": f"hybridsim {sim.__version__}",
        "source": source,
        "scenario": scenario.name,
        "asserts": asserts,
        "streams": [[label, base] for base, label in sorted(streams.items())],
        "script": _compact_script(script),
        "notes": {
            "requests": request_notes,
            "actions": [_action_note(dict(a), script) for a in script["actions"]],
            "admission_fields": list(ADMISSION_FIELDS),
        },
        "expected": expected,
        "contrast": contrast,
    }


# ------------------------------------------------------------------ the code


def pretty_json(value: Any, indent: str = "") -> str:
    """``value`` as ASCII-only JSON, one item per line where a line would be long (lists of scalars stay on one)."""
    flat = json.dumps(value, ensure_ascii=True)
    if not isinstance(value, (dict, list)) or not value or len(indent) + len(flat) <= 100:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=True)}: {pretty_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    if all(not isinstance(v, (dict, list)) for v in value):
        return flat
    return "[\n" + ",\n".join(f"{inner}{pretty_json(v, inner)}" for v in value) + "\n" + indent + "]"


def case_literal(document: dict[str, Any]) -> str:
    """``CASE = json.loads(...)``: the document as implicitly concatenated ``repr()`` string literals, one per
    JSON line (lines break between JSON tokens, so no newline is needed; the JSON is ASCII-only, so every
    literal is printable ASCII)."""
    pieces = [repr(line) for line in pretty_json(document).split("\n")]
    return "CASE = json.loads(\n" + "".join(f"    {p}\n" for p in pieces) + ")\n"


HEADER = """\
# Exported by `hybridsim export vllm-test`. Self-contained: needs only pytest and vllm, the release CASE's script
# names (its "vllm_version": the scenario's).
# Run: VLLM_TARGET_DEVICE=cpu python -m pytest THIS_FILE
# The test is at the end of the file, after hybridsim's vLLM harness: CASE (the scenario, lowered, and what
# hybridsim observed, as one JSON document; CASE["asserts"] says what the tests assert) and the test code.
"""

TEST_PREAMBLE = """

# ============================================================================ the exported test
# Everything above is hybridsim's vLLM harness (sim/verify/vllm_side.py), verbatim. Below: the case as data
# (one JSON document), then fixed code that runs it through vLLM and compares.

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

"""

TEST_CODE = '''

def _script(changes: dict) -> dict:
    """CASE's lowered script with ``changes``, each prompt's ``[first, length]`` runs expanded to token ids."""
    script = dict(CASE["script"], **changes)
    requests = []
    for request in script["requests"]:
        request = dict(request)
        runs = request.pop("prompt_runs")
        request["prompt_token_ids"] = [token for first, n in runs for token in range(first, first + n)]
        requests.append(request)
    script["requests"] = requests
    return script


def _observed(changes: dict) -> dict:
    """vLLM's crash and admission attempts on the script, in the shape of CASE["expected"]."""
    try:
        trace = run_script(_script(changes))
    finally:
        cleanup_model_dirs()
    admissions = [
        [s["step"], a["request"], a["kind"], list(a["hits"]), a["local"], a["external"], bool(a["hit_diverged"]),
         bool(a["fallback"]), a["result"]]
        for s in trace["steps"] for a in s["admissions"]
    ]
    return {"crash": trace["crash"], "admissions": admissions}


def test_vllm_decides_as_hybridsim() -> None:
    """vLLM makes hybridsim's decisions on the scenario: CASE["asserts"][0] says which."""
    observed = _observed({})
    assert observed["crash"] == CASE["expected"]["crash"]
    assert observed["admissions"] == CASE["expected"]["admissions"]
'''

CONTRAST_TEST_CODE = '''

def test_contrast_policy_runs_clean() -> None:
    """Under the contrast policy (CASE["contrast"]["policy"]) the scenario runs without a crash, making
    hybridsim's decisions: CASE["asserts"][1] says which."""
    contrast = CASE["contrast"]
    observed = _observed(contrast["script"])
    assert observed["crash"] is None
    assert observed["admissions"] == contrast["expected"]["admissions"]
'''


def module_text(document: dict[str, Any]) -> str:
    """The pytest module for ``document``: fixed code around the one ``CASE`` literal."""
    code = TEST_CODE + (CONTRAST_TEST_CODE if document["contrast"] is not None else "")
    return HEADER + inspect.getsource(vllm_side) + TEST_PREAMBLE + case_literal(document) + code


def export_vllm_test(scenario: Scenario, source: str) -> str:
    """The pytest module for ``scenario`` (:class:`ExportError` if it cannot be run through vLLM)."""
    return module_text(case(scenario, source))


def write_module(out: Path, text: str, *, force: bool = False, notes: list[str] | None = None) -> None:
    """Write the exported module to ``out`` (the one place ``export vllm-test`` writes a file), through
    :func:`sim.trace.output.write_file`: a link at ``out`` is refused, a file hybridsim did not write is kept
    unless ``force`` (then it is kept aside, a line in ``notes``)."""
    from sim.trace.output import write_file

    write_file(out, text, force=force, notes=notes, option="-o/--out")
