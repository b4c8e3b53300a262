"""Trace readers: Mooncake expansion (exact), Qwen, Azure, our own JSONL/Parquet, errors."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.core.kv.hashing import RequestBlockHasher, extend_block_hashes, hash_block
from sim.core.tokens import IdsSegment, StreamBlocksSegment, StreamSegment, basic_segments, block_content
from sim.workload import WorkloadError
from sim.workload.traces.common import expand_hash_blocks

MOONCAKE = [
    {"timestamp": 0, "input_length": 1300, "output_length": 10, "hash_ids": [1, 2, 3]},
    {"timestamp": 1500, "input_length": 1100, "output_length": 0, "hash_ids": [1, 2, 4]},
    {"timestamp": 250, "input_length": 512, "output_length": 7, "hash_ids": [5]},
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def mooncake(build, tmp_path, rows=MOONCAKE, **kw):
    name = write_jsonl(tmp_path / "mc.jsonl", rows)
    return build({"trace": {"format": "mooncake", "path": name}}, **kw)


def expected_chain(ids, input_length, bs):
    """Hashes built by hand: block i is positions [(i*bs) % 512, +bs) of stream mc:<id of its 512-block>."""
    chain, parent = [], None
    for i in range(input_length // bs):
        seg = StreamSegment(f"mc:{ids[i * bs // 512]}", (i * bs) % 512, bs)
        parent = hash_block(parent, block_content([seg], 0, bs))
        chain.append(parent)
    return chain


def test_mooncake_fields_and_order(build, tmp_path):
    reqs = mooncake(build, tmp_path)
    assert [r.request_id for r in reqs] == ["mc1", "mc3", "mc2"]
    assert [r.arrival_time for r in reqs] == [0.0, 0.25, 1.5]
    a, c, b = reqs
    assert a.prompt == (StreamBlocksSegment("mc:", (1, 2, 3), 512, 1300),)  # one object for all the blocks
    assert basic_segments(a.prompt) == (
        StreamSegment("mc:1", 0, 512),
        StreamSegment("mc:2", 0, 512),
        StreamSegment("mc:3", 0, 276),
    )
    assert (a.num_prompt_tokens, a.max_tokens, a.output_len) == (1300, 10, 10)
    assert (b.max_tokens, b.output_len) == (1, 1)  # output_length 0: at least one token
    assert basic_segments(c.prompt) == (StreamSegment("mc:5", 0, 512),)


def _per_block_expansion(prefix, hash_ids, input_length, trace_block):
    """The expansion by definition: one StreamSegment per hash block, the last cut to the input length."""
    segments = [StreamSegment(f"{prefix}{h}", 0, trace_block) for h in hash_ids]
    tail = input_length - (len(hash_ids) - 1) * trace_block
    segments[-1] = StreamSegment(f"{prefix}{hash_ids[-1]}", 0, tail)
    return segments


def test_hash_block_expansion_hashes_equal_the_per_block_expansion():
    """Random traces: the compact expansion has the per-block expansion's tokens, so its block hashes."""
    rng = np.random.default_rng(3)
    for _ in range(200):
        trace_block = int(rng.choice([4, 16, 512]))
        n = int(rng.integers(1, 12))
        hash_ids = [int(h) for h in rng.integers(0, 6, size=n)]  # repeats, as in a conversation trace
        input_length = int(rng.integers((n - 1) * trace_block + 1, n * trace_block + 1))
        compact = expand_hash_blocks("mc:", hash_ids, input_length, trace_block, "t.jsonl:1")
        spelled = _per_block_expansion("mc:", hash_ids, input_length, trace_block)
        assert basic_segments(compact) == tuple(spelled)
        out = (StreamSegment("\x00out:r", 0, int(rng.integers(1, 40))),)  # the output follows the prompt
        for bs in {1, 3, 16, 48, 528, 1040}:  # divisors, non-divisors, blocks spanning several trace blocks
            want: list = []
            got: list = []
            total = input_length + out[0].length
            assert extend_block_hashes(want, [*spelled, *out], total, bs, "lora", "salt") == total // bs
            extend_block_hashes(got, compact + out, total, bs, "lora", "salt")
            assert got == want
            # Incrementally too (the engine extends a request's hashes as it decodes).
            inc: list = []
            for upto in (input_length, total):
                extend_block_hashes(inc, compact + out, upto, bs)
            plain: list = []
            extend_block_hashes(plain, [*spelled, *out], total, bs)
            assert inc == plain


def test_hash_ids_must_be_integers():
    for bad in ([1, True], [1, 2.0], [1, "2"]):
        with pytest.raises(WorkloadError, match=r"t.jsonl:1: 'hash_ids' must hold integers, got"):
            expand_hash_blocks("mc:", bad, 600, 512, "t.jsonl:1")


@pytest.mark.parametrize("bs", [16, 64, 256, 512])
def test_mooncake_expansion_is_exact_and_keeps_shared_blocks_shared(build, tmp_path, bs):
    a, _, b = mooncake(build, tmp_path, hash_block_size=bs)
    a.set_block_hasher(RequestBlockHasher(bs))
    b.set_block_hasher(RequestBlockHasher(bs))
    assert len(a.block_hashes) == 1300 // bs  # the partial 276-token tail adds 276 // bs blocks
    assert len(b.block_hashes) == 1100 // bs
    assert a.block_hashes == expected_chain([1, 2, 3], 1300, bs)
    assert b.block_hashes == expected_chain([1, 2, 4], 1100, bs)
    shared = 1024 // bs
    assert a.block_hashes[:shared] == b.block_hashes[:shared]
    if len(b.block_hashes) > shared:
        assert a.block_hashes[shared] != b.block_hashes[shared]


@pytest.mark.parametrize("bs", [48, 1024, 0])
def test_mooncake_refuses_block_sizes_that_do_not_divide_512_when_merging_is_off(build, tmp_path, bs):
    name = write_jsonl(tmp_path / "mc.jsonl", MOONCAKE)
    spec = {"trace": {"format": "mooncake", "path": name, "allow_merged_blocks": False}}
    with pytest.raises(WorkloadError, match=f"hash block size {bs} does not divide 512"):
        build(spec, hash_block_size=bs)


def test_merged_blocks_are_accepted_by_default(build, tmp_path):
    """A 1040-token block spans three 512-token trace blocks; the default accepts it (shared iff its tokens are)."""
    reqs = mooncake(build, tmp_path, hash_block_size=1040)
    assert len(reqs) == len(MOONCAKE)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "invalid JSON"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1}', "missing field 'hash_ids'"),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1]}',
            "1 hash_ids for input_length 600; expected ceil(600/512) = 2",
        ),
        (
            '{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}',
            "'timestamp' must be a finite number >= 0",
        ),
        (
            '{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}',
            "'input_length' must be an integer",
        ),
        (
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": ["x"]}',
            "'hash_ids' must hold integers",
        ),
        ("[1, 2]", "expected a JSON object"),
    ],
)
def test_mooncake_malformed_lines_name_file_and_line(build, tmp_path, line, message):
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps(MOONCAKE[0]) + "\n\n" + line + "\n")
    with pytest.raises(WorkloadError) as exc:
        build({"trace": {"format": "mooncake", "path": "mc.jsonl"}})
    assert str(exc.value).startswith(f"{path}:3: ")
    assert message in str(exc.value)


def test_missing_trace_file(build):
    with pytest.raises(WorkloadError, match="trace file: file not found"):
        build({"trace": {"format": "mooncake", "path": "nope.jsonl"}})


QWEN = [
    {
        "chat_id": 3,
        "parent_chat_id": -1,
        "timestamp": 0.5,
        "input_length": 40,
        "output_length": 5,
        "type": "text",
        "turn": 1,
        "hash_ids": [10, 11, 12],
    },
    {
        "chat_id": 9,
        "parent_chat_id": 3,
        "timestamp": 2.25,
        "input_length": 70,
        "output_length": 8,
        "type": "text",
        "turn": 2,
        "hash_ids": [10, 11, 13, 14, 15],
    },
]


def test_qwen_blocks_parents_and_refusal(build, tmp_path):
    name = write_jsonl(tmp_path / "qwen.jsonl", QWEN)
    root, child = build({"trace": {"format": "qwen", "path": name}}, hash_block_size=16)
    assert (root.request_id, child.request_id) == ("q3", "q9")
    assert child.arrival_time == 2.25
    assert child.metadata == {"chat_id": 9, "parent": "q3", "turn": 2, "type": "text"}
    assert root.metadata["parent"] is None
    assert basic_segments(child.prompt)[-1] == StreamSegment("qw:15", 0, 6)
    root.set_block_hasher(RequestBlockHasher(16))
    child.set_block_hasher(RequestBlockHasher(16))
    assert len(root.block_hashes) == 2 and len(child.block_hashes) == 4  # 40 // 16, 70 // 16
    assert root.block_hashes == child.block_hashes[:2]
    with pytest.raises(WorkloadError, match="does not divide 16"):
        build({"trace": {"format": "qwen", "path": name, "allow_merged_blocks": False}}, hash_block_size=32)
    write_jsonl(tmp_path / "dup.jsonl", [QWEN[0], QWEN[0]])
    with pytest.raises(WorkloadError, match=r"dup.jsonl:2: chat_id 3 already used on line 1"):
        build({"trace": {"format": "qwen", "path": "dup.jsonl"}})


def test_azure_csv(build, tmp_path):
    (tmp_path / "az.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,0\n"
        "2023-11-16 18:15:46.1805900,100,7\n"
    )
    reqs = build({"trace": {"format": "azure", "path": "az.csv"}})
    assert [r.request_id for r in reqs] == ["az4", "az2", "az3"]
    assert [r.arrival_time for r in reqs] == pytest.approx([0.0, 0.5, 4.814579])
    assert reqs[1].prompt == (StreamSegment("az:2", 0, 374),)
    assert (reqs[2].max_tokens, reqs[2].output_len) == (1, 1)
    (tmp_path / "bad.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,10,2\nyesterday,10,2\n")
    with pytest.raises(WorkloadError, match=r"bad.csv:3: TIMESTAMP: cannot parse 'yesterday'"):
        build({"trace": {"format": "azure", "path": "bad.csv"}})
    (tmp_path / "cols.csv").write_text("time,ContextTokens\n")
    with pytest.raises(WorkloadError, match=r"cols.csv:1: missing column\(s\) TIMESTAMP, GeneratedTokens"):
        build({"trace": {"format": "azure", "path": "cols.csv"}})


def test_own_jsonl_format_with_ids_and_segments(build, tmp_path):
    rows = [
        {"id": "a", "at": 1.0, "token_ids": list(range(48)), "max_tokens": 5, "output_len": 3},
        {
            "id": "b",
            "at": 2.0,
            "prompt": [{"ids": list(range(32))}, {"content": "x", "tokens": 16}],
            "max_tokens": 2,
            "lora": "l1",
        },
        {
            "id": 7,
            "at": 0.5,
            "prompt": [{"content": "x", "start": 4, "tokens": 8}, {"output_of": "a", "tokens": 3}],
            "max_tokens": 1,
        },
    ]
    name = write_jsonl(tmp_path / "own.jsonl", rows)
    c, a, b = build({"trace": {"format": "requests", "path": name}})
    assert (c.request_id, a.request_id, b.request_id) == ("7", "a", "b")
    assert a.prompt == (IdsSegment(np.arange(48)),) and a.output_len == 3
    assert b.lora_name == "l1" and b.output_len == 2
    a.set_block_hasher(RequestBlockHasher(16))
    b.lora_name = None
    b.set_block_hasher(RequestBlockHasher(16))
    assert len(a.block_hashes) == len(b.block_hashes) == 3
    assert a.block_hashes[:2] == b.block_hashes[:2] and a.block_hashes[2] != b.block_hashes[2]
    write_jsonl(tmp_path / "bad.jsonl", [rows[0], {"id": "z", "at": 0, "max_tokens": 1}])
    with pytest.raises(WorkloadError, match=r"bad.jsonl:2: .*exactly one of 'prompt'"):
        build({"trace": {"format": "requests", "path": "bad.jsonl"}})
    write_jsonl(tmp_path / "dup.jsonl", [rows[0], rows[0]])
    with pytest.raises(WorkloadError, match=r"dup.jsonl:2: duplicate request id 'a'"):
        build({"trace": {"format": "requests", "path": "dup.jsonl"}})


def test_own_parquet_format(build, tmp_path):
    ids = pa.array([list(range(20)), list(range(10, 30))], type=pa.list_(pa.int32()))
    table = pa.table(
        {"id": ["p", "q"], "at": [0.0, 1.0], "max_tokens": [4, 4], "output_len": [2, None], "token_ids": ids}
    )
    pq.write_table(table, tmp_path / "own.parquet")
    p, q = build({"trace": {"format": "requests", "path": "own.parquet"}})
    assert p.prompt == (IdsSegment(np.arange(20)),) and q.prompt == (IdsSegment(np.arange(10, 30)),)
    assert (p.output_len, q.output_len) == (2, 4)
    seg = table.drop_columns(["token_ids"]).append_column(
        "prompt", pa.array([json.dumps([{"content": "d", "tokens": 9}]), json.dumps([{"content": "d", "tokens": 0}])])
    )
    pq.write_table(seg, tmp_path / "seg.parquet")
    with pytest.raises(WorkloadError, match=r"seg.parquet:2: prompt.0.content.tokens"):
        build({"trace": {"format": "requests", "path": "seg.parquet"}})


def test_merged_blocks_are_exact_when_allowed(build, tmp_path):
    """A hybrid model's 1040-token blocks span trace blocks; opting in gives exact content."""
    name = write_jsonl(
        tmp_path / "mc.jsonl",
        [
            {"timestamp": 0, "input_length": 2100, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]},
            {"timestamp": 1, "input_length": 2100, "output_length": 1, "hash_ids": [1, 2, 3, 4, 6]},
            {"timestamp": 2, "input_length": 2100, "output_length": 1, "hash_ids": [1, 2, 7, 4, 5]},
            {"timestamp": 3, "input_length": 2090, "output_length": 1, "hash_ids": [1, 2, 3, 4, 5]},
        ],
    )
    a, b, c, d = build(
        {"trace": {"format": "mooncake", "path": name, "allow_merged_blocks": True}}, hash_block_size=1040
    )
    for r in (a, b, c, d):
        r.set_block_hasher(RequestBlockHasher(1040))
    # Block 0 = tokens [0, 1040) = mc:1, mc:2, mc:3[0:16]; block 1 = mc:3[16:512], mc:4, mc:5[0:32].
    first = hash_block(
        None,
        block_content(
            [StreamSegment("mc:1", 0, 512), StreamSegment("mc:2", 0, 512), StreamSegment("mc:3", 0, 16)], 0, 1040
        ),
    )
    assert a.block_hashes[0] == b.block_hashes[0] == first
    assert a.block_hashes[1] != b.block_hashes[1]  # tokens [2048, 2080) come from mc:5 vs mc:6
    assert d.block_hashes == a.block_hashes  # a shorter partial tail of the same ids: same 2 blocks
    assert c.block_hashes[0] != first
    with pytest.raises(Exception, match="allow_merged_blocks applies to the mooncake and qwen formats"):
        build({"trace": {"format": "azure", "path": "x.csv", "allow_merged_blocks": True}})


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": [1, 2.5, "x\\u00e9"], "b": null}\n',
        '{"k": "caf\u00e9 \u2603"}\n'.encode(),
        b'{"k": "\xed\xa0\x80"}\n',  # an encoded lone surrogate: json.loads of bytes lets it through
        b'{"k": "\xff"}\n',  # not UTF-8
        b"\xef\xbb\xbf" + b'{"k": 1}\n',  # UTF-8 BOM
        '{"k": 2}\n'.encode("utf-16-le"),
        '{"k": 3}'.encode("utf-32-be"),
        b"{",
        b'{"k": 1} x\n',
        b"[1]\n",
    ],
)
def test_jsonl_lines_parse_as_json_loads_of_the_bytes(tmp_path, raw):
    """The line decoding shortcut gives json.loads(raw)'s object, or an error where json.loads raises."""
    import io

    from sim.workload.traces.common import jsonl_objects

    path = tmp_path / "t.jsonl"
    path.write_bytes(raw)
    want = []
    try:  # the reference: json.loads of each line's bytes, the lines as a binary file splits them
        for line_no, line in enumerate(io.BytesIO(raw), start=1):
            if line.strip():
                want.append((line_no, json.loads(line)))
        ok = all(isinstance(obj, dict) for _, obj in want)
    except (ValueError, UnicodeDecodeError):
        ok = False
    if ok:
        assert list(jsonl_objects(path)) == want
    else:
        with pytest.raises(WorkloadError, match=r"t.jsonl:\d+: "):
            list(jsonl_objects(path))


def _same_json(a, b):
    """Equal, and of the same types all the way down (``1 == 1.0 == True``), with keys in the same order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(_same_json, a, b))
    return a == b


@pytest.mark.parametrize(
    "raw",
    [
        *(json.dumps(row).encode() for row in MOONCAKE),
        b'{"a": 1, "a": 2}',  # json.loads keeps the last
        b'{"a": 1234567890123456789}',  # 19 digits: orjson reads an int this long as a float
        b'{"a": -12345678901234567890123, "b": 1}',
        b'{"a": [1, 1e400]}',  # orjson refuses infinity, json.loads gives inf
        b'{"a": Infinity, "b": -Infinity}',  # orjson refuses them
        b'{"a": "\\ud800"}',  # a lone surrogate escape
        b'{"a": -0, "b": -0.0, "c": 1.5e-7, "d": 0.1}',
        b'{"a\\u00e9": {"b": [true, false, null, "x"]}}',
    ],
)
def test_json_line_is_json_loads(raw):
    """A line gives json.loads' object: the same keys in the same order and the same types all the way down."""
    from sim.workload.traces.common import _json_line

    for line in (raw, raw + b"\n"):
        assert _same_json(_json_line(line), json.loads(line))


_JSON_PIECES = [
    b"{",
    b"}",
    b"[",
    b"]",
    b'"',
    b": ",
    b", ",
    b",",
    b":",
    b" ",
    b"-",
    b"0",
    b"1",
    b"9",
    b"42",
    b"07",
    b"1.5",
    b"e3",
    b"e999",
    b'"k"',
    b'"hash_ids"',
    b"\\",
    b"\\ud800",
    b"\n",
    b"\xc3\xa9",
    b"\xed\xa0\x80",
    b"\x00",
    b"null",
    b"Infinity",
    b"1234567890",
]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_JSON_PIECES), max_size=24), st.booleans())
def test_json_line_is_json_loads_on_any_bytes(pieces, wrap):
    """On any bytes, the same object as json.loads (same types, same key order) or an error where it raises."""
    from sim.workload.traces.common import _json_line

    raw = b"".join(pieces)
    if wrap:
        raw = b'{"k": ' + raw + b"}"
    try:
        want = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            _json_line(raw)
        return
    assert _same_json(_json_line(raw), want)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 02]}', "invalid JSON"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2.5]}', "got 2.5"),
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []}', "'input_length' must be from 1 to"),
        ('{"timestamp": 0, "input_length": 600, "output_length": -1, "hash_ids": [1, 2]}', "'output_length' must be"),
        ('{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2, 3]}', "3 hash_ids for"),
        (  # a repeated key: json.loads keeps the last
            '{"timestamp": 0, "input_length": 600, "input_length": 10, "output_length": 1, "hash_ids": [1, 2]}',
            "2 hash_ids for input_length 10",
        ),
    ],
)
def test_mooncake_lines_of_the_fast_spelling_are_refused_as_before(build, tmp_path, line, message):
    """Lines one byte off a Mooncake line: the same errors as json.loads gives."""
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps(MOONCAKE[0]) + "\n" + line + "\n")
    with pytest.raises(WorkloadError) as exc:
        build({"trace": {"format": "mooncake", "path": "mc.jsonl"}})
    assert str(exc.value).startswith(f"{path}:2: ")
    assert message in str(exc.value)
