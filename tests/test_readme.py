"""The README's Tour runs as written: every command of its ```bash blocks, in order, in a fresh folder.

The folder holds only links to the checkout's ``scenarios/`` and to this interpreter's environment as
``.venv``, so each command finds what a new user's clone has after ``make run``, and each later command sees
exactly the bundles the earlier ones wrote. ``make`` lines (setup, tests, benchmarks) are left out: they are
what runs this suite. A command that fails names itself, with its last lines of output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def readme_commands(text: str) -> list[str]:
    """The shell commands of the README's ```bash blocks, in order, comments and ``make`` lines removed."""
    commands = []
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, re.S):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command and not command.startswith("#") and not command.startswith("make "):
                commands.append(command)
    return commands


def test_the_command_list_is_what_a_reader_sees():
    text = "intro\n```bash\nmake run   # setup\n.venv/bin/hybridsim run a.yaml -o r  # run\n# a comment\n```\n"
    text += "```python\nimport sim\n```\n```bash\nx || [ $? -eq 3 ]   # exit 3\n```\n"
    assert readme_commands(text) == [".venv/bin/hybridsim run a.yaml -o r", "x || [ $? -eq 3 ]"]


@pytest.mark.slow
def test_the_readme_tour_runs_in_order_on_a_fresh_folder(tmp_path: Path) -> None:
    commands = readme_commands((REPO / "README.md").read_text(encoding="utf-8"))
    assert any("compare" in c for c in commands) and any("shrink" in c for c in commands)
    (tmp_path / "scenarios").symlink_to(REPO / "scenarios")
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {**os.environ, "COLUMNS": "120"}
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-5:])
        assert done.returncode == 0, f"README command failed (exit {done.returncode}): {command}\n{tail}"
