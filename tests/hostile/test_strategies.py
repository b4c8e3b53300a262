"""Hostile input drawn by hypothesis, against every command that reads it (issue 36).

Strategies: request ids and content labels (any Unicode: markup, escapes, formulas, bidi controls),
numbers at every numeric scenario key (huge ints, inf, NaN, denormals), output and input paths with odd
characters, and tampered bundles (summary values of the wrong type, manifest entries outside the bundle,
bogus table columns). Every command must exit 0 or refuse in one line (exit 2), never with a traceback;
a run's CSV never starts a formula; a file outside the command's output is never touched.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hostile.common import BASE, assert_clean, assert_user_file_kept, invoke, plant_user_file

BASE_DOC = yaml.safe_load(BASE)
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

#: Hostile text: arbitrary Unicode plus the shapes attackers use.
hostile_text = st.one_of(
    st.text(min_size=1, max_size=40),
    st.sampled_from(
        [
            "[/]",
            "[bold red]x[/]",
            '=HYPERLINK("http://x","y")',
            "+cmd|' /C calc'!A0",
            "-2+3",
            "@SUM(A1)",
            "\x1b]0;pwned\x07",
            "\x1b[2J",
            "a\u202eb",
            "doc\nprint(1),\n#",
            '"""',
            "ｄｏｃ",
            "x" * 300,
            "",
            "\t=1",
        ]
    ),
)


def _scenario(tmp: Path, doc: dict, name: str = "s.yaml") -> Path:
    path = tmp / name
    # Escaped (allow_unicode=False): PyYAML writes U+0085 raw into a quoted scalar and reads it back as a
    # space, so the file would hold another id than the one drawn ('\x85' ran as ' ').
    path.write_text(yaml.safe_dump(doc, allow_unicode=False, sort_keys=False), encoding="utf-8")
    return path


def _with_request(request_id: str, label: str) -> dict:
    doc = copy.deepcopy(BASE_DOC)
    doc["workload"]["requests"] = [
        {"id": request_id, "at": 0, "prompt": [{"content": label, "tokens": 40}], "max_tokens": 2},
        {"id": "tail", "at": 1, "prompt": [{"content": label, "tokens": 40}], "max_tokens": 2},
    ]
    if request_id == "tail":
        doc["workload"]["requests"][1]["id"] = "tail2"
    return doc


@FAST
@given(request_id=hostile_text, label=hostile_text)
@example(request_id="r\x85", label="doc")  # NEL: refused (it once reached the file as a space)
def test_ids_and_labels_are_refused_cleanly_or_run_and_render_safely(tmp_path_factory, request_id, label) -> None:
    tmp = tmp_path_factory.mktemp("ids")
    digest = plant_user_file(tmp)
    scenario = _scenario(tmp, _with_request(request_id, label))
    res = invoke(["validate", scenario])
    assert_clean(res)
    printable = all(s.isprintable() and 0 < len(s) <= 256 for s in (request_id, label))
    assert (res.exit_code == 0) == printable, res.output
    if res.exit_code == 0:
        out = tmp / "out"
        ran = invoke(["run", scenario, "-o", out, "--format", "csv", "--no-plots"])
        assert_clean(ran)
        assert ran.exit_code == 0
        assert "\x1b" not in ran.output
        csv_text = (out / "requests.csv").read_text(encoding="utf-8")
        assert not any(line.startswith(("=", "+", "-", "@", "\t", "\r")) for line in csv_text.splitlines())
        for command in (["show", out], ["explain", out, "--", request_id]):
            shown = invoke(command)
            assert_clean(shown)
            assert shown.exit_code == 0 and "\x1b" not in shown.output
    assert_user_file_kept(tmp, digest)


#: Numeric keys of a scenario and of its workload, with a value drawn for each.
NUMERIC_KEYS = [
    "seed",
    "cache.num_blocks",
    "cache.block_size",
    "cache.retention_interval",
    "scheduler.max_num_seqs",
    "scheduler.max_num_batched_tokens",
    "scheduler.max_model_len",
    "scheduler.long_prefill_token_threshold",
    "scheduler.watermark",
    "workload.requests.0.at",
    "workload.requests.0.max_tokens",
    "workload.requests.0.output_len",
    "workload.requests.0.priority",
    "workload.requests.0.prompt.0.tokens",
    "workload.requests.0.prompt.0.start",
    "workload.limit",
    "workload.time_scale",
    "workload.sample",
]
hostile_number = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**400),
    st.sampled_from([float("inf"), float("-inf"), float("nan"), 1e-320, 5e-324, 1e308, -0.0, 2**63, 2**53 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)


@FAST
@given(key=st.sampled_from(NUMERIC_KEYS), value=hostile_number)
def test_any_number_at_any_key_is_refused_in_one_line_or_valid(key: str, value) -> None:
    text = (
        repr(value)
        if not isinstance(value, float)
        else {"inf": ".inf", "-inf": "-.inf", "nan": ".nan"}.get(repr(value), repr(value))
    )
    from hostile.common import BASE_YAML

    assert_clean(invoke(["validate", BASE_YAML, "--set", f"{key}={text}"]))


odd_name = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=30
).filter(lambda s: s not in (".", ".."))


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(folder=odd_name, file=odd_name)
def test_odd_paths_for_input_and_output(tmp_path_factory, folder: str, file: str) -> None:
    tmp = tmp_path_factory.mktemp("paths")
    digest = plant_user_file(tmp)
    try:
        scenario = _scenario(tmp, copy.deepcopy(BASE_DOC), name=file)
    except OSError:
        return  # a name this file system refuses (too long in bytes)
    out = tmp / folder
    res = invoke(["run", scenario, "-o", out, "-q", "--no-plots"])
    assert_clean(res)
    if res.exit_code == 0:
        shown = invoke(["show", out])
        assert_clean(shown)
        assert shown.exit_code == 0
    assert_user_file_kept(tmp, digest)


# ---------------------------------------------------------------- tampered bundles


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "b"
    from hostile.common import BASE_YAML

    assert invoke(["run", BASE_YAML, "-o", out, "-q", "--format", "csv"]).exit_code == 0
    return out


def _rehash(b: Path) -> None:
    """Make the manifest match the tampered files (an attacker would), so the readers meet the values."""
    manifest = json.loads((b / "manifest.json").read_text())
    for rel in manifest["files"]:
        p = b / rel
        if isinstance(rel, str) and not rel.startswith("/") and ".." not in rel and p.is_file():
            manifest["files"][rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    for entry in manifest.get("tables", {}).values():
        if isinstance(entry, dict) and entry.get("file") in manifest["files"]:
            entry["sha256"] = manifest["files"][entry["file"]]
    (b / "manifest.json").write_text(json.dumps(manifest))


json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
SUMMARY_KEYS = ["status", "steps", "groups", "block_sizes", "latency_s", "requests", "admissions", "cache", "crash"]


@st.composite
def tampering(draw):
    kind = draw(st.sampled_from(["summary", "nested", "manifest", "column", "table-cell"]))
    if kind == "summary":
        return kind, draw(st.sampled_from(SUMMARY_KEYS)), draw(json_value)
    if kind == "nested":
        return (
            kind,
            draw(st.sampled_from(["latency_s.ttft.p50", "requests.total", "admissions.by_outcome.ok"])),
            draw(json_value),
        )
    if kind == "manifest":
        return (
            kind,
            draw(st.sampled_from(["/proc/self/mem", "../../outside.txt", "/etc/passwd", "a/../../b", "x\\y"])),
            None,
        )
    if kind == "column":
        return kind, draw(st.sampled_from(["hit_g99999999999", "hit_g1024", "[/]", "=1+1", "hit_g-1"])), None
    return kind, draw(st.sampled_from(["request_id", "prompt_tokens", "outcome"])), draw(hostile_text)


@FAST
@given(change=tampering())
def test_tampered_bundles_are_refused_in_one_line(tmp_path_factory, bundle: Path, change) -> None:
    tmp = tmp_path_factory.mktemp("tampered")
    digest = plant_user_file(tmp)
    b = tmp / "b"
    shutil.copytree(bundle, b)
    kind, key, value = change
    if kind in ("summary", "nested"):
        summary = json.loads((b / "summary.json").read_text())
        node = summary
        *parents, leaf = key.split(".")
        for part in parents:
            node = node[part]
        node[leaf] = value
        (b / "summary.json").write_text(json.dumps(summary))
    elif kind == "manifest":
        manifest = json.loads((b / "manifest.json").read_text())
        manifest["files"][key] = "0" * 64
        (b / "manifest.json").write_text(json.dumps(manifest))
    elif kind == "column":
        lines = (b / "admissions.csv").read_text().splitlines()
        lines = [lines[0] + f",{key}"] + [line + ",1" for line in lines[1:]]
        (b / "admissions.csv").write_text("\n".join(lines) + "\n")
    else:
        import pandas as pd

        frame = pd.read_csv(b / "requests.csv", dtype=str, keep_default_na=False)
        frame[key] = value
        frame.to_csv(b / "requests.csv", index=False)
    _rehash(b)
    for command in (["show", b], ["compare", b, bundle], ["trace", "diff", b, bundle], ["explain", b, "r0"]):
        res = invoke(command)
        assert "Traceback" not in (res.stdout or "") + (res.stderr or "")
        assert res.exception is None or isinstance(res.exception, SystemExit), (command, repr(res.exception))
        if command[0] != "trace":  # trace diff exits 1 when the bundles differ
            assert_clean(res)
    assert_user_file_kept(tmp, digest)


def test_the_drawn_text_reaches_the_scenario_file_exactly(tmp_path) -> None:
    """The hypothesis tests above judge hybridsim on the drawn ids: the written file must hold those ids."""
    doc = _with_request("r\x85", "d\u2028")
    loaded = yaml.safe_load(_scenario(tmp_path, doc).read_text(encoding="utf-8"))
    assert loaded == doc
