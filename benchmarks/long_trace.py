"""Write a long Mooncake-like trace for memory measurements (docs/limits.md, "Memory of a long run").

The Mooncake conversation trace repeated end to end until ``N`` lines: repeat ``k`` has its timestamps shifted
by ``k`` times the trace's span (largest minus smallest timestamp) and its hash ids by ``k`` times (largest
hash id + 1), so repeats share no content. Usage::

    python benchmarks/long_trace.py 1000000 /tmp/trace1m.jsonl [--source ../shared/traces/mooncake_conversation_trace.jsonl]

Point ``workload.trace.path`` of ``scenarios/mooncake-conversation-nemotron.yaml`` at the output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

DEFAULT_SOURCE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "mooncake_conversation_trace.jsonl"


def write_long_trace(source: Path, lines: int, out: Path) -> None:
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    stamps = [row["timestamp"] for row in rows]
    span = max(stamps) - min(stamps)
    id_shift = max((max(row["hash_ids"]) for row in rows if row["hash_ids"]), default=-1) + 1
    with out.open("w") as fh:
        written, k = 0, 0
        while written < lines:
            for row in rows[: lines - written]:
                shifted = {
                    "timestamp": row["timestamp"] + k * span,
                    "input_length": row["input_length"],
                    "output_length": row["output_length"],
                    "hash_ids": [h + k * id_shift for h in row["hash_ids"]],
                }
                fh.write(json.dumps(shifted) + "\n")
            written += min(len(rows), lines - written)
            k += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lines", type=int)
    parser.add_argument("out", type=Path)
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    args = parser.parse_args()
    if args.lines < 1:
        parser.error("lines must be at least 1")
    write_long_trace(args.source, args.lines, args.out)


if __name__ == "__main__":
    main()
