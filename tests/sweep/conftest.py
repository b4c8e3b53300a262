from __future__ import annotations

from pathlib import Path

import pytest

BASE = """\
name: fake-base
seed: 7
clock: steps
cache: {block_size: 16, num_blocks: 100}
scheduler: {prefix_policy: reconciled}
"""


@pytest.fixture
def base_scenario(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(BASE)
    return path
