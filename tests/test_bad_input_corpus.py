"""A corpus of hostile and mistaken input: every case exits 2 with at most 4 lines and no traceback.

Cases are variations of tests/bad_input/base.yaml: ``--set`` overrides, whole YAML files, trace files and
empirical tables, and command lines. Each must be refused by ``validate`` (or the named command) with exit 2,
at most 4 lines of output, no traceback, and a message that names the offending key, file or limit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.registries import Valid
from typer.testing import CliRunner

from sim.cli import app

FIXTURES = Path(__file__).resolve().parent / "bad_input"
BASE = (FIXTURES / "base.yaml").read_text()

# (override, fragment of the error) — each applied to base.yaml with validate --set.
SET_CASES: list[tuple[str, str | Valid]] = [
    ("name=..", "name:"),
    ("name=.", "name:"),
    ('name="../../x"', "name:"),
    ('name="/etc"', "name:"),
    ('name="a/b"', "name:"),
    ('name="a\\\\b"', "name:"),
    ('name="x\\0y"', "name:"),
    ('name=".hidden"', "name:"),
    ('name="-rf"', "name:"),
    ('name=" padded"', "name:"),
    ('name="tab\\there"', "name:"),
    ('name=""', "name:"),
    ("name=" + "x" * 200, "name:"),
    ("seed=-1", "seed"),
    ("seed=1.5", "seed"),
    ("seed=[1]", "seed"),
    ("seed=99999999999999999999999", "seed"),
    ("seed=true", "seed"),
    ("clock=hours", "clock"),
    ("cache.num_blocks=1.0e30", "num_blocks"),
    ("cache.num_blocks=1e30", "num_blocks"),
    ("cache.num_blocks=-5", "num_blocks"),
    ("cache.num_blocks=0", "num_blocks"),
    ("cache.num_blocks=1", "num_blocks"),
    ("cache.num_blocks=abc", "num_blocks"),
    ("cache.num_blocks=[1, 2]", "num_blocks"),
    ("cache.num_blocks=60000000", "HYBRIDSIM_MAX_NUM_BLOCKS"),
    ("cache.block_size=0", "block_size"),
    ("cache.block_size=-16", "block_size"),
    ("cache.block_size=.inf", "block_size"),
    ("cache.enable_prefix_caching=yes please", "enable_prefix_caching"),
    ("cache.enable_prefix_caching=1", "enable_prefix_caching"),
    ('cache.enable_prefix_caching="true"', "enable_prefix_caching"),
    ("cache.groups=[]", "groups"),
    ("cache.groups=[banana]", "groups"),
    ("cache.groups=nope", "groups"),
    ("cache.kv_memory_gb=1", "kv_memory_gb"),
    ("cache.retention_interval=-1", "retention_interval"),
    ("cache.mamba_cache_mode=sometimes", "mamba_cache_mode"),
    ("cache.num_blok=10", "num_blok"),
    ("scheduler.max_num_seqs=0", "max_num_seqs"),
    ("scheduler.max_num_batched_tokens=-1", "max_num_batched_tokens"),
    ("scheduler.max_model_len=0", "max_model_len"),
    ("scheduler.watermark=1.5", "watermark"),
    ("scheduler.watermark=.nan", "watermark"),
    ("scheduler.policy=lifo", "policy"),
    ("scheduler.prefix_policy=pr4842", "did you mean"),
    ("scheduler.prefix_policy=", "prefix_policy"),
    ("connector.type=lmcachee", Valid("connector.type")),
    ("connector.type=scriptd", "did you mean 'scripted'"),
    ("connector={type: scripted, matched_tokens: [1, 2]}", "connector"),
    ("connector={type: scripted, matched_tokens: {r1: 16}}", "connector.matched_tokens.r1"),
    ("connector={type: scripted, holds: {r00: 16}}", "did you mean 'r0'"),
    ("connector={type: scripted, load_async: {x: true}}", "connector.load_async.x"),
    ("connector={type: scripted, matched_tokens: {r0: -1}}", "matched_tokens"),
    ("connector={type: scripted, matched_tokens: {r0: many}}", "matched_tokens"),
    ("connector={type: scripted, matched_tokns: {r0: 16}}", "did you mean 'matched_tokens'"),
    ("connector={type: scripted, supports_divergent_local_hybrid_hits: yes please}", "must be true or false"),
    ("connector={type: scripted, supports_hma: 1}", "must be true or false"),
    ("connector={type: scripted, async_load_steps: 0}", "async_load_steps"),
    ("connector={type: offload, bogus: 1}", "connector.bogus"),
    ("connector={type: remote, bogus: 1}", "connector.bogus"),
    ("workload.requests=[]", "at least one request"),
    ("workload.requests.0.max_tokens=0", "max_tokens"),
    ("workload.requests.0.max_tokens=-3", "max_tokens"),
    ("workload.requests.0.at=-1", "at"),
    ("workload.requests.0.at=1.0e300", "at"),
    ("workload.requests.0.at=.inf", "at"),
    ("workload.requests.0.at=.nan", "at"),
    ("workload.requests.0.prompt=[]", "prompt"),
    ("workload.requests.0.prompt=[{content: doc, tokens: 0}]", "tokens"),
    ("workload.requests.0.prompt=[{content: doc, tokens: -4}]", "tokens"),
    ("workload.requests.0.prompt=[{contnt: doc, tokens: 4}]", "contnt"),
    ("workload.requests.0.prompt=[{content: doc, tokens: 8000}]", "max_model_len"),
    ("workload.too_long=maybe", "too_long"),
    ("workload.limit=0", "limit"),
    ("workload.sample=0", "sample"),
    ("workload.sample=2", "sample"),
    ("workload.time_scale=0", "time_scale"),
    ("workload.time_scale=1.0e300", "time_scale"),
    ("workload.time_window=[5, 1]", "time_window"),
    ("workload.trace={format: mooncake, path: nope.jsonl}", "workload"),
    ("workload.generator={arrivals: {process: poisson, rate: 1.0}, count: 5}", "workload"),
    ("outputs.tables_format=xlsx", "tables_format"),
    ("outputs.plots=sometimes", "plots"),
    ("on_crash=explode", "on_crash"),
    ("check_invariants=maybe", "check_invariants"),
    ("actions=[{at: 0, evict: {prefix_of: r1, group: 0, blocks: [0]}}]", "prefix_of"),
    ("actions=[{at: 0}]", "actions"),
    ("actions=[{at: 0.5, reset_prefix_cache: true}]", "step number"),
    ("slo={ttft_s: -1}", "slo"),
    ("model={preset: nemotron-h-9b}", "did you mean"),
    ("hardware={preset: h100}", "hardware"),
]

GEN = "{{process: poisson, rate: {rate}}}"
GENERATOR = (
    "workload={{generator: {{arrivals: {arrivals}, {bound}, structure: {{kind: unique, prompt: "
    "{{dist: fixed, value: 64}}}}, output: {{dist: fixed, value: 4}}}}}}"
)
SET_CASES += [
    (GENERATOR.format(arrivals=GEN.format(rate=1.0), bound="count: 10000000"), "HYBRIDSIM_MAX_REQUESTS"),
    (GENERATOR.format(arrivals=GEN.format(rate=1.0e6), bound="duration: 100000"), "HYBRIDSIM_MAX_REQUESTS"),
    (GENERATOR.format(arrivals=GEN.format(rate=1.0e-300), bound="duration: 10"), "rate"),
    (GENERATOR.format(arrivals=GEN.format(rate=".inf"), bound="count: 10"), "rate"),
    (GENERATOR.format(arrivals=GEN.format(rate=1.0), bound="duration: 1.0e300"), "duration"),
    (GENERATOR.format(arrivals=GEN.format(rate=1.0), bound="count: 0"), "count"),
    (GENERATOR.format(arrivals="{process: gamma, rate: 1.0, cv: 0}", bound="count: 10"), "cv"),
    (
        GENERATOR.format(arrivals="{process: schedule, pieces: [{start: 1, rate: 1.0}]}", bound="count: 10"),
        "first piece",
    ),
]


def _deep_yaml(depth: int) -> str:
    return BASE + "extra:\n" + "".join("  " * i + "k:\n" for i in range(1, depth)) + "  " * depth + "x: 1\n"


BOMB = "".join(
    f"{c}: &{c} [" + ",".join([f"*{p}"] * 9 if p else ['"lol"'] * 9) + "]\n"
    for c, p in zip("abcdefghi", [None, *"abcdefgh"])
)

# (file name, text or bytes, fragment) — whole files given to validate.
FILE_CASES: list[tuple[str, str | bytes, str]] = [
    ("empty.yaml", "", "empty"),
    ("list.yaml", "- a\n- b\n", "mapping"),
    ("scalar.yaml", "42\n", "mapping"),
    ("tab.yaml", "name: x\n\tseed: 1\n", "tab.yaml:2"),
    ("unclosed.yaml", "name: [x\n", "unclosed.yaml"),
    ("dupkey.yaml", BASE + "seed: 1\n", "duplicate key"),
    ("python.yaml", "name: !!python/object/apply:os.system [ls]\n", "not allowed"),
    ("custom-tag.yaml", "name: !mytag x\n", "not allowed"),
    ("binary-tag.yaml", "name: !!binary aGVsbG8=\n", "not allowed"),
    ("set-tag.yaml", "name: !!set {a, b}\n", "not allowed"),
    ("omap.yaml", "name: !!omap [{a: 1}]\n", "not allowed"),
    ("bomb.yaml", BOMB, "HYBRIDSIM_MAX_YAML_NODES"),
    ("deep-block.yaml", _deep_yaml(80), "HYBRIDSIM_MAX_YAML_DEPTH"),
    (
        "deep-flow.yaml",
        "name: x\nk: " + "[" * 3000 + "]" * 3000 + "\n",
        "nesting",
    ),  # libyaml: "exceeded maximum nesting depth"; ours: "nesting is too deep"
    ("latin1.yaml", b"name: caf\xe9\nseed: 0\n", "not UTF-8"),
    ("nul-name.yaml", BASE.replace("name: base", 'name: "a\\0b"'), "name:"),
    ("multi-doc.yaml", BASE + "---\nname: two\n", "multi-doc.yaml"),
    ("no-workload.yaml", "name: x\ncache: {block_size: 16, num_blocks: 50, groups: [full_attention]}\n", "workload"),
    ("key-not-scalar.yaml", BASE + "? [a, b]\n: 1\n", "plain scalar"),
    ("huge.yaml", "name: x\n# " + "y" * (9 * 1024 * 1024) + "\n", "HYBRIDSIM_MAX_YAML_BYTES"),
]

TRACE_SCENARIO = """\
name: tr
cache: {{block_size: 16, num_blocks: 500, groups: [full_attention, mamba]}}
workload:
  trace: {{format: {fmt}, path: {path}}}
"""

# (format, file name, content, fragment) — a trace read through a scenario.
TRACE_CASES: list[tuple[str, str, str | bytes, str]] = [
    ("mooncake", "t1.jsonl", "{not json\n", "t1.jsonl:1: invalid JSON"),
    ("mooncake", "t2.jsonl", "[1, 2]\n", "expected a JSON object"),
    (
        "mooncake",
        "t3.jsonl",
        '{"timestamp": 1e300, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
        "timestamp",
    ),
    (
        "mooncake",
        "t4.jsonl",
        '{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
        "timestamp",
    ),
    (
        "mooncake",
        "t5.jsonl",
        '{"timestamp": 0, "input_length": "ten", "output_length": 1, "hash_ids": [1]}\n',
        "input_length",
    ),
    ("mooncake", "t6.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": 1}\n', "hash_ids"),
    (
        "mooncake",
        "t7.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}\n',
        "hash_ids",
    ),
    (
        "mooncake",
        "t8.jsonl",
        b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "x": "\xff"}\n',
        "UTF-8",
    ),
    ("mooncake", "t9.jsonl", '{"a": ' * 5000 + "1" + "}" * 5000 + "\n", "t9.jsonl:1"),
    (
        "mooncake",
        "t10.jsonl",
        '{"timestamp": NaN, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
        "timestamp",
    ),
    (
        "mooncake",
        "t11.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]}\n',
        "output_length",
    ),
    (
        "mooncake",
        "t12.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [true]}\n',
        "hash_ids",
    ),
    ("mooncake", "missing.jsonl", None, "trace file: file not found"),  # type: ignore[list-item]
    (
        "qwen",
        "q1.jsonl",
        '{"chat_id": 1, "timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
        '{"chat_id": 1, "timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
        "already used",
    ),
    (
        "qwen",
        "q2.jsonl",
        '{"chat_id": -4, "timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n',
        "chat_id",
    ),
    ("azure", "a1.csv", "root:$6$secrethash:19000:0:99999:7:::\n", "missing column"),
    ("azure", "a2.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,2\n", "TIMESTAMP"),
    ("azure", "a3.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,ten,2\n", "ContextTokens"),
    ("azure", "a4.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10\n", "2 fields, the header has 3"),
    ("azure", "a5.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,2\xff\n", "UTF-8"),
    ("azure", "a6.csv", "", "empty file"),
    ("azure", "a7.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n1e400,10,2\n", "TIMESTAMP"),
    ("requests", "r1.jsonl", '{"id": "a", "prompt": [], "max_tokens": 2}\n', "r1.jsonl:1"),
    (
        "requests",
        "r2.jsonl",
        '{"id": "a", "prompt": [{"content": "d", "tokens": 4}], "max_tokens": 2}\n' * 2,
        "duplicate request id",
    ),
]

EMPIRICAL = (
    "workload={{generator: {{arrivals: {{process: poisson, rate: 1.0}}, count: 5, structure: {{kind: unique, "
    "prompt: {{dist: empirical, path: {path}}}}}, output: {{dist: fixed, value: 4}}}}}}"
)

# (file name, content, fragment) — an empirical length table.
EMPIRICAL_CASES: list[tuple[str, str | bytes, str]] = [
    ("e1.csv", "root:$6$secrethash:19000\n", "needs a 'value' column"),
    ("e2.csv", "value,weight\n10,1\n20\n", "1 fields, the header has 2"),
    ("e3.csv", "value,weight\nten,1\n", "'ten'"),
    ("e4.csv", "value,weight\n10,-1\n", "finite and >= 0"),
    ("e5.csv", b"value,weight\n10,1\n\xff\xfe,1\n", "UTF-8"),
    ("e6.csv", "value,weight\n", "no rows"),
    ("e7.csv", "value\n" + "x" * 500 + "\n", "'xxxxxxxxxxxxxxxxxxxxxxxx'..."),
]

CLI_CASES: list[tuple[list[str], str]] = [
    (["validate", "nope.yaml"], "not found"),
    (["run", "nope.yaml", "--no-plots", "-q"], "not found"),
    (["validate", "{base}", "--set", "novalue"], "key.path=value"),
    (["validate", "{base}", "--set", "=1"], "key.path=value"),
    (["validate", "{base}", "--set", "a..b=1"], "key.path=value"),
    (["validate", "{base}", "--set", "seed=[unclosed"], "seed"),
    (["sweep", "{base}", "--seeds", "99999999999999999999999", "-o", "{tmp}/sw"], "HYBRIDSIM_MAX_SEEDS"),
    (["sweep", "{base}", "--seeds", "-3", "-o", "{tmp}/sw"], "seeds"),
    (["sweep", "{base}", "--seeds", "1,1", "-o", "{tmp}/sw"], "distinct"),
    (
        [
            "sweep",
            "{base}",
            "--grid",
            "cache.num_blocks=" + ",".join(map(str, range(100, 600))),
            "--grid",
            "scheduler.max_num_seqs=" + ",".join(map(str, range(1, 301))),
            "-o",
            "{tmp}/sw",
        ],
        "HYBRIDSIM_MAX_SWEEP_RUNS",
    ),
    (["sweep", "{base}", "--grid", "seed=1,2", "-o", "{tmp}/sw"], "seed"),
    (["sweep", "{base}", "--grid", "nokey", "-o", "{tmp}/sw"], "key.path"),
    (["show", "{tmp}/nothing"], "does not exist"),
    (["show", "{tmp}"], "summary.json is missing"),
    (["trace", "diff", "{tmp}/a", "{tmp}/b"], "does not exist"),
    (["trace", "diff", "{tmp}", "{tmp}", "--tables", "bogus"], "unknown tables"),
    (["replay", "{tmp}"], "no replay.yaml"),
    (["workload", "stats", "{tmp}/none.jsonl"], "not found"),
    (["run", "{base}", "{base}", "-o", "{tmp}/dup", "--no-plots", "-q"], "is also the name of"),
    (["run", "{base}", "-o", "{tmp}/userdir", "--no-plots", "-q"], "did not write"),
]


def invoke(args: list[str]):
    return CliRunner().invoke(app, args)


def assert_clean_refusal(res, *fragments: str | Valid) -> None:
    out = (res.stdout or "") + (res.stderr or "")
    assert res.exit_code == 2, out
    assert "Traceback" not in out, out
    assert len(out.splitlines()) <= 4, out
    for fragment in map(str, fragments):
        assert fragment in out, f"{fragment!r} not in {out!r}"


def test_the_corpus_has_at_least_100_cases() -> None:
    total = len(SET_CASES) + len(FILE_CASES) + len(TRACE_CASES) + len(EMPIRICAL_CASES) + len(CLI_CASES)
    assert total >= 100, total


@pytest.mark.parametrize("override, fragment", SET_CASES, ids=[c[0][:40] for c in SET_CASES])
def test_override(override: str, fragment: str | Valid) -> None:
    assert_clean_refusal(invoke(["validate", str(FIXTURES / "base.yaml"), "--set", override]), fragment)


@pytest.mark.parametrize("name, text, fragment", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_file(tmp_path: Path, name: str, text: str | bytes, fragment: str) -> None:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert_clean_refusal(invoke(["validate", str(path)]), name, fragment)


@pytest.mark.parametrize("fmt, name, content, fragment", TRACE_CASES, ids=[c[1] for c in TRACE_CASES])
def test_trace(tmp_path: Path, fmt: str, name: str, content: str | bytes | None, fragment: str) -> None:
    if content is not None:
        (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    scenario = tmp_path / "s.yaml"
    scenario.write_text(TRACE_SCENARIO.format(fmt=fmt, path=name))
    res = invoke(["validate", str(scenario)])
    assert_clean_refusal(res, name, fragment)
    assert "secrethash" not in res.output  # never echo the file's content


@pytest.mark.parametrize("name, content, fragment", EMPIRICAL_CASES, ids=[c[0] for c in EMPIRICAL_CASES])
def test_empirical_table(tmp_path: Path, name: str, content: str | bytes, fragment: str) -> None:
    (tmp_path / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    scenario = tmp_path / "s.yaml"
    scenario.write_text(BASE)
    res = invoke(["validate", str(scenario), "--set", EMPIRICAL.format(path=tmp_path / name)])
    assert_clean_refusal(res, name, fragment)
    assert "secrethash" not in res.output and "x" * 30 not in res.output


@pytest.mark.parametrize("args, fragment", CLI_CASES, ids=[" ".join(c[0])[:40] for c in CLI_CASES])
def test_command_line(tmp_path: Path, monkeypatch, args: list[str], fragment: str) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "userdir").mkdir()
    (tmp_path / "userdir" / "mine.txt").write_text("keep\n")
    argv = [a.format(base=FIXTURES / "base.yaml", tmp=tmp_path) for a in args]
    assert_clean_refusal(invoke(argv), fragment)
    assert (tmp_path / "userdir" / "mine.txt").read_text() == "keep\n"
