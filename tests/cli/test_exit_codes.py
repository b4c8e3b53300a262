"""One table of exit codes: ``sim.cli.exit_codes.ExitCode`` and docs/cli.md's table list the same numbers, and
each run status and verify verdict maps to one of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sim.cli.exit_codes import RUN_STATUS_EXIT, ExitCode
from sim.cli.verify import _verify_exit
from sim.verify.run import VerifyStatus

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _table_codes(page: str, heading: str) -> list[int]:
    text = (DOCS / page).read_text(encoding="utf-8")
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return [int(code) for code in re.findall(r"^\| (\d+) \|", section, re.M)]


def test_the_cli_doc_lists_every_exit_code_once_and_no_other():
    documented = _table_codes("cli.md", "Exit codes")
    assert len(documented) == len(set(documented)), f"docs/cli.md lists a code twice: {documented}"
    assert sorted(documented) == sorted({int(code) for code in ExitCode})


def test_verify_doc_codes_are_the_cli_codes_of_its_verdicts():
    assert sorted(_table_codes("verify.md", "Exit codes")) == sorted(int(_verify_exit(s)) for s in VerifyStatus)


def test_not_verifiable_no_longer_shares_a_number_with_a_crash():
    assert _verify_exit(VerifyStatus.NOT_VERIFIABLE) == ExitCode.NOT_VERIFIABLE != ExitCode.CRASH


@pytest.mark.parametrize("status", ["complete", "crashed", "stalled", "stopped", "invariant_violation", "interrupted"])
def test_every_run_status_has_an_exit_code(status):
    assert RUN_STATUS_EXIT[status] in ExitCode
