"""Driving the ``hybridsim`` CLI in-process, and the smallest scenario that crashes it."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from sim.cli import app

# FA + Mamba; r0 caches 32 tokens of `doc`, then the scripted connector claims all 80 prompt tokens of r1
# as external beyond its local hit of 16: the claimed boundary passes the prompt, vLLM's scheduler asserts.
CRASHING = """\
name: tiny-crash
seed: 0
clock: steps
cache: {block_size: 16, num_blocks: 50, groups: [full_attention, mamba]}
scheduler: {max_num_seqs: 4, max_num_batched_tokens: 8192, max_model_len: 8192}
connector: {type: scripted, matched_tokens: {r1: 80}}
workload:
  requests:
    - {id: r0, at: 0, prompt: [{content: doc, tokens: 32}], max_tokens: 2}
    - {id: r1, at: 3, prompt: [{content: doc, tokens: 80}], max_tokens: 2}
on_crash: stop
"""


def invoke(*args: str | Path):
    """``hybridsim ARGS`` through typer's runner, on a wide terminal so rich tables print labels in full."""
    return CliRunner(env={"COLUMNS": "250"}).invoke(app, [str(a) for a in args])
