"""The end-to-end fuzz (sim.e2e): its scenarios, its failure records, and a fixed-seed walk (slow tier)."""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml
from support.cli import invoke
from support.registries import BUILTIN_NAMES

from sim.config.load import scenario_from_text
from sim.e2e import driver
from sim.e2e.path import Failure, Walk
from sim.e2e.scenarios import CONNECTORS, generate


def _connector_types(data: dict) -> set[str]:
    connector = data.get("connector", {})
    kinds = {connector.get("type", "none")}
    if "wraps" in connector:
        kinds.add(connector["wraps"]["type"])
    kinds |= {child["type"] for child in connector.get("connectors", [])}
    return kinds


def test_scenarios_are_deterministic_and_valid() -> None:
    for index in range(40):
        data, files = generate(7, index)
        assert generate(7, index) == (data, files)
        if not files:  # a trace scenario reads its file relative to itself: checked in the walk below
            scenario_from_text(yaml.safe_dump(data), f"{data['name']}.yaml")


def test_scenarios_cover_every_builtin_connector_and_policy() -> None:
    """Derived from the registries: a new built-in must be added to the generator (an installed plug-in not)."""
    seen: dict[str, set[str]] = {
        "connector.type": set(),
        "scheduler.prefix_policy": set(),
        "cache.eviction_policy": set(),
    }
    kinds: set[str] = set()
    for index in range(300):
        data, files = generate(3, index)
        seen["connector.type"] |= _connector_types(data)
        seen["scheduler.prefix_policy"].add(data["scheduler"].get("prefix_policy", "pr48425"))
        seen["cache.eviction_policy"].add(data["cache"].get("eviction_policy", "lru"))
        kinds.add("trace" if files else data["clock"])
        kinds |= {"sessions"} if "sessions" in data["workload"] else set()
        kinds |= {"crash-record"} if data["on_crash"] == "record" else set()
        kinds |= {a_kind for a in data.get("actions", []) for a_kind in a if a_kind != "at"}
    for key, names in seen.items():
        assert set(BUILTIN_NAMES[key]()) <= names, key
    assert set(CONNECTORS) == set(BUILTIN_NAMES["connector.type"]())
    assert {"steps", "time", "trace", "sessions", "crash-record", "evict", "reset_prefix_cache"} <= kinds
    assert "connector_fault" in kinds


def test_a_quarter_of_the_scenarios_run_on_every_shape_of_cluster() -> None:
    """The cluster layer: every built-in router, a shared tier, P/D roles and per-instance overrides, on every
    kind of scenario; each one valid (no scripted action, no connector beside a tier or P/D roles); and the
    scenarios left on one instance are those the seed gave before (the layer draws from its own stream)."""
    from sim.cluster.router import builtin_router_names

    seen: set[str] = set()
    routers: set[str] = set()
    clustered = 0
    for index in range(300):
        data, files = generate(3, index)
        cluster = data.get("cluster")
        if cluster is None:
            continue
        clustered += 1
        assert not data.get("actions")
        routers.add(cluster["router"]["policy"])
        seen.add("trace" if files else data["clock"])
        instances = cluster["instances"]
        if isinstance(instances, list) and any(i.get("role") for i in instances):
            seen.add("pd")
            assert data["connector"] == {"type": "none"}
        elif isinstance(instances, list):
            seen.add("overrides")
        if "tier" in cluster:
            seen.add("tier")
            assert data["connector"] == {"type": "none"}
            if isinstance(instances, list) and any(i.get("role") for i in instances):
                seen.add("pd+tier")
        if not files:
            scenario_from_text(yaml.safe_dump(data), f"{data['name']}.yaml")
    assert 50 <= clustered <= 100
    assert routers == set(builtin_router_names())
    assert {"steps", "time", "trace", "pd", "tier", "pd+tier", "overrides"} <= seen


def test_the_cluster_layer_leaves_the_other_scenarios_as_they_were(monkeypatch) -> None:
    from sim.e2e import scenarios

    drawn = [generate(3, index) for index in range(60)]
    monkeypatch.setattr(scenarios, "CLUSTER_SHARE", 0.0)
    for index, (data, files) in enumerate(drawn):
        if "cluster" not in data:
            assert generate(3, index) == (data, files)


def test_a_failed_check_is_written_out_as_a_scenario_and_the_command(tmp_path: Path, monkeypatch) -> None:
    def failing_walk(scenario: Path, work: Path, rng, vllm: bool) -> Walk:
        return Walk(
            status="complete", checks=["run", "show"], failures=[Failure(["show", str(work)], 1, "show: exit 1")]
        )

    monkeypatch.setattr(driver, "walk", failing_walk)
    figures = driver.fuzz_e2e(5, 2, tmp_path / "out", lambda line: None, use_vllm=False)
    assert (figures.scenarios, figures.failed) == (2, 2)
    folder = tmp_path / "out" / "e2e-5-0"
    assert yaml.safe_load((folder / "scenario.yaml").read_text())["name"] == "e2e-5-0"
    assert "$ hybridsim show" in (folder / "failure.txt").read_text()
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["failed"] == 2


def _failing_walk(seen: list) -> object:
    def failing_walk(scenario: Path, work: Path, rng, vllm: bool) -> Walk:
        seen.append((yaml.safe_load(scenario.read_text())["vllm_version"], vllm))
        return Walk(status="complete", checks=["run"], failures=[Failure(["run", str(scenario)], 1, "run: exit 1")])

    return failing_walk


def test_failures_go_through_the_output_writer(tmp_path: Path, monkeypatch) -> None:
    """OUT's files are hybridsim's own: a rerun replaces them (the trace, which cannot carry a stamp, because
    it is byte-identical); a user's file is refused, and with force kept aside; a link as OUT is refused."""
    from sim.trace.output import OutputPathError

    monkeypatch.setattr(driver, "walk", _failing_walk([]))
    out = tmp_path / "out"
    run = lambda **kw: driver.fuzz_e2e(5, 1, out, lambda line: None, start=6, use_vllm=False, **kw)  # noqa: E731
    run()
    folder = out / "e2e-5-6"
    assert sorted(p.name for p in folder.iterdir()) == ["failure.txt", "pytest.txt", "scenario.yaml", "trace.jsonl"]
    run()  # the same seed into the same OUT: no --force needed
    trace = folder / "trace.jsonl"
    trace.write_text(trace.read_text() + "\n")  # edited by the user: no longer provably ours
    with pytest.raises(OutputPathError, match="did not write"):
        run()
    assert trace.read_text().endswith("\n\n")
    lines: list[str] = []
    driver.fuzz_e2e(5, 1, out, lines.append, start=6, use_vllm=False, force=True)
    assert (folder / "trace.jsonl.old").read_text().endswith("\n\n")
    assert any(line.startswith("warning:") and "trace.jsonl.old" in line for line in lines)
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(OutputPathError, match="symbolic link"):
        driver.fuzz_e2e(5, 1, tmp_path / "link", lambda line: None, use_vllm=False)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_scenarios_are_for_the_release_asked_and_vllm_checks_only_on_that_release(monkeypatch, tmp_path) -> None:
    from sim.verify import vllm_side

    seen: list = []
    monkeypatch.setattr(driver, "walk", _failing_walk(seen))
    driver.fuzz_e2e(5, 3, tmp_path / "a", lambda line: None, use_vllm=False, vllm_version="0.33")
    assert seen == [("0.33", False)] * 3
    seen.clear()
    monkeypatch.setattr(vllm_side, "installed_release", lambda: "0.34")
    monkeypatch.setattr(vllm_side, "vllm_version", lambda: "0.34.0")
    lines: list[str] = []
    driver.fuzz_e2e(5, 2, tmp_path / "b", lines.append, use_vllm=True, vllm_version="0.33")
    assert seen == [("0.33", False)] * 2  # vLLM 0.34 cannot verify a 0.33 scenario: its checks are skipped
    assert lines[0].startswith("warning:") and "vLLM 0.34.0 is installed" in lines[0]
    seen.clear()
    driver.fuzz_e2e(5, 2, tmp_path / "c", lambda line: None, use_vllm=True)
    assert seen == [("0.34", True)] * 2  # default: the installed release, checked against it


def test_a_signal_stops_the_whole_fuzz_with_its_figures_written(tmp_path: Path, monkeypatch) -> None:
    """SIGTERM lands inside one of the walk's in-process commands (the run, paused at its first step), which
    turns it into its exit code 130: the fuzz stops too (it went on with the next check before), exits 130
    and writes the figures so far, marked interrupted."""
    monkeypatch.setattr(driver, "_vllm_installed", lambda: False)
    monkeypatch.setenv("HYBRIDSIM_TEST_PAUSE", "run:8")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    walking = threading.Event()

    def kill_once_walking() -> None:  # the first scenario's work folder is there: its run comes next
        while not walking.wait(0.05):
            if list(tmp_path.glob("hybridsim-e2e-5-0-*/scenario.yaml")):
                time.sleep(0.5)
                os.kill(os.getpid(), signal.SIGTERM)
                walking.set()

    killer = threading.Thread(target=kill_once_walking, daemon=True)
    killer.start()
    try:
        res = invoke("fuzz", "--e2e", "--seed", "5", "--count", "2", "-o", tmp_path / "out")
    finally:
        walking.set()
        killer.join()
    assert res.exit_code == 130, res.output
    assert res.stderr.splitlines()[-1].startswith("error: interrupted (SIGTERM)"), res.stderr
    assert (tmp_path / "out" / "summary.json").is_file(), res.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["scenarios"] == 0 and summary["failed"] == 0


#: The CI walk: a fixed seed and count (about a minute of CPU on 2 cores without vLLM; vLLM adds verify,
#: export and its import).
CI_SEED, CI_COUNT = 29, 16


@pytest.mark.slow
def test_fixed_seed_walks_the_whole_user_path_without_a_failure(tmp_path: Path) -> None:
    lines: list[str] = []
    started = time.process_time()
    figures = driver.fuzz_e2e(CI_SEED, CI_COUNT, tmp_path / "out", lines.append)
    assert figures.failed == 0, "\n".join(lines)
    assert figures.refused == 0, "\n".join(lines)
    assert figures.scenarios == CI_COUNT and figures.checks["trace diff"] == CI_COUNT
    assert time.process_time() - started < 180
