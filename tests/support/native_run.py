"""Worker of the native differential test: run scenarios, print a fingerprint of every table as JSON.

Usage: ``python native_run.py SPEC...`` where a SPEC is a scenario file or
``fuzz:SEED:INDEX`` (``sim.verify.fuzz.generate``). Which build runs is the
caller's choice, through ``HYBRIDSIM_NATIVE``; the output says which one did
(``compiled``: the listed modules that came from their extensions).
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

OVERRIDES = ["outputs.plots=false", "outputs.schedule_table=true"]


def _scenario(spec: str):
    from sim.config import load_scenario, scenario_from_text

    if spec.startswith("fuzz:"):
        from sim.verify.fuzz import generate, scenario_yaml

        _, seed, index = spec.split(":")
        return scenario_from_text(scenario_yaml(generate(int(seed), int(index))), f"<{spec}>", overrides=OVERRIDES)
    return load_scenario(spec, OVERRIDES)


def fingerprint(spec: str) -> dict[str, str]:
    from sim.api import RunOptions, run_scenario

    return fingerprint_result(run_scenario(_scenario(spec), None, options=RunOptions(write_plots=False)))


def fingerprint_result(result: Any) -> dict[str, str]:
    """SHA-256 of every table's CSV and of the summary, by name."""
    out = {name: hashlib.sha256(df.to_csv(index=False).encode()).hexdigest() for name, df in result.tables.items()}
    out["summary"] = hashlib.sha256(json.dumps(result.summary, sort_keys=True, default=str).encode()).hexdigest()
    return dict(sorted(out.items()))


def main(specs: list[str]) -> None:
    from sim import native

    runs = {spec: fingerprint(spec) for spec in specs}
    json.dump(
        {"status": native.status().reason, "compiled": native.compiled_modules_loaded(), "runs": runs}, sys.stdout
    )


if __name__ == "__main__":
    main(sys.argv[1:])
