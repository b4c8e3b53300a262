"""The workload spec: one source, forbidden extras, segment forms, clear errors."""

import pytest
from pydantic import ValidationError

from sim.workload.spec import (
    ContentSegmentSpec,
    FixedDist,
    GeneratorSpec,
    OutputSegmentSpec,
    RecordSpec,
    WorkloadSpec,
)

ONE = {"id": "r0", "at": 0, "prompt": [{"content": "doc", "tokens": 80}], "max_tokens": 1}


def test_script_segments_parse_to_their_kinds():
    spec = WorkloadSpec.model_validate(
        {
            "requests": [
                ONE,
                {
                    "id": 7,
                    "at": 5,
                    "prompt": [
                        {"content": "doc", "start": 16, "tokens": 32},
                        {"output_of": "r0", "tokens": 1},
                    ],
                    "max_tokens": 4,
                    "output_len": 2,
                    "priority": 3,
                    "lora": "a",
                    "cache_salt": "s",
                },
            ]
        }
    )
    r1 = spec.requests[1]
    assert r1.id == "7"
    assert r1.prompt[0] == ContentSegmentSpec(content="doc", start=16, tokens=32)
    assert r1.prompt[1] == OutputSegmentSpec(output_of="r0", start=0, tokens=1)
    assert spec.requests[0].prompt[0].start == 0


@pytest.mark.parametrize(
    "workload, fragment",
    [
        ({}, "exactly one of 'requests', 'generator' or 'trace'"),
        ({"requests": [ONE], "trace": {"format": "azure", "path": "x.csv"}}, "got requests, trace"),
        ({"requests": [ONE, ONE]}, "duplicate request id 'r0'"),
        ({"requests": [{**ONE, "colour": 1}]}, "colour"),
        ({"requests": [{**ONE, "prompt": [{"content": "d", "tokens": 0}]}]}, "tokens"),
        ({"requests": [{**ONE, "prompt": [{"ids": [1, 2]}]}]}, "ids"),
        ({"requests": [ONE], "time_window": [5, 5]}, "time_window end"),
        ({"requests": [ONE], "sample": 0}, "sample"),
        ({"trace": {"format": "sharegpt", "path": "x"}}, "mooncake"),
    ],
)
def test_bad_workloads_name_the_problem(workload, fragment):
    with pytest.raises(ValidationError) as exc:
        WorkloadSpec.model_validate(workload)
    assert fragment in str(exc.value)


def test_number_is_a_fixed_distribution_and_count_or_duration_is_required():
    gen = GeneratorSpec.model_validate(
        {
            "arrivals": {"process": "poisson", "rate": 1},
            "count": 3,
            "structure": {"kind": "unique", "prompt": 100},
            "output": 8,
        }
    )
    assert gen.structure.prompt == FixedDist(dist="fixed", value=100)
    with pytest.raises(ValidationError, match="give 'count', 'duration' or both"):
        GeneratorSpec.model_validate({**gen.model_dump(), "count": None})


@pytest.mark.parametrize(
    "arrivals, fragment",
    [
        ({"process": "schedule", "pieces": [{"start": 1, "rate": 1}]}, "must start at 0"),
        ({"process": "schedule", "pieces": [{"start": 0, "rate": 1}, {"start": 0, "rate": 2}]}, "increase"),
        ({"process": "schedule", "pieces": [{"start": 0, "rate": 0}]}, "rate > 0"),
        ({"process": "gamma", "rate": 1}, "cv"),
        ({"process": "poisson", "rate": -1}, "rate"),
    ],
)
def test_bad_arrivals(arrivals, fragment):
    with pytest.raises(ValidationError) as exc:
        GeneratorSpec.model_validate(
            {"arrivals": arrivals, "count": 1, "structure": {"kind": "unique", "prompt": 1}, "output": 1}
        )
    assert fragment in str(exc.value)


def test_rag_needs_enough_documents():
    with pytest.raises(ValidationError, match="docs_per_prompt"):
        GeneratorSpec.model_validate(
            {
                "arrivals": {"process": "poisson", "rate": 1},
                "count": 1,
                "structure": {"kind": "rag", "num_documents": 2, "doc_len": 10, "docs_per_prompt": 3, "query_len": 5},
                "output": 1,
            }
        )


def test_record_takes_exactly_one_prompt_form():
    RecordSpec.model_validate({"id": "a", "max_tokens": 1, "token_ids": [1, 2]})
    RecordSpec.model_validate({"id": "a", "max_tokens": 1, "prompt": [{"ids": [1]}, {"content": "x", "tokens": 2}]})
    with pytest.raises(ValidationError, match="exactly one"):
        RecordSpec.model_validate({"id": "a", "max_tokens": 1})
    with pytest.raises(ValidationError, match="exactly one"):
        RecordSpec.model_validate({"id": "a", "max_tokens": 1, "token_ids": [1], "prompt": [{"ids": [1]}]})


def test_segments_serialize_as_their_own_kind_and_round_trip(recwarn):
    """The discriminator tags model instances too, so dumping an ``output_of`` or ``ids`` segment
    neither warns nor turns it into a content segment."""
    record = {
        "id": "r1",
        "at": 0,
        "max_tokens": 1,
        "prompt": [{"content": "doc", "tokens": 8}, {"output_of": "r0", "tokens": 2}, {"ids": [5, 6]}],
    }
    spec = RecordSpec.model_validate(record)
    dumped = spec.model_dump(exclude_defaults=True)
    assert dumped["prompt"] == [{"content": "doc", "tokens": 8}, {"output_of": "r0", "tokens": 2}, {"ids": [5, 6]}]
    assert RecordSpec.model_validate(dumped) == spec
    assert not [w for w in recwarn if "serializ" in str(w.message).lower()]
