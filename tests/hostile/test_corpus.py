"""The fixed hostile-input corpus (issue 36): each case is refused in one line naming what is wrong, or runs.

Cases by class: special files given as input (FIFO, device, /proc file, directory), huge or odd numbers,
bad kernel profiles, connector options that collide with the registry's own parameters, ``validate``
agreeing with ``run``, oversized inputs. Each runs in a folder with a planted user file that must be kept.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from hostile.common import (
    BASE,
    BASE_YAML,
    PROFILE,
    assert_refused,
    assert_user_file_kept,
    copy_profile,
    invoke,
    plant_user_file,
)

BIG = "9" * 400

# (override applied to base.yaml, fragments of the one error line) -- validate must refuse each.
NUMBER_CASES: list[tuple[str, tuple[str, ...]]] = [
    (f"workload.requests.0.prompt=[{{content: doc, tokens: {BIG}}}]", ("prompt.0.tokens", "<= 16777216")),
    ("workload.requests.0.prompt=[{content: doc, start: 1" + "0" * 30 + ", tokens: 4}]", ("prompt.0.start",)),
    (f"connector={{type: scripted, matched_tokens: {{r0: {BIG}}}}}", ("connector.matched_tokens.r0",)),
    ("cache={block_size: 16, kv_memory_gb: 1e308, groups: [full_attention, mamba]}", ("cache.kv_memory_gb",)),
    ("actions=[{at: .inf, reset_prefix_cache: true}]", ("actions.0.at", "finite")),
    ("actions=[{at: .nan, reset_prefix_cache: true}]", ("actions.0.at", "finite")),
    ("slo={ttft_s: .inf}", ("slo.ttft_s", "finite")),
    ("slo={tpot_s: 1e300}", ("slo.tpot_s",)),
    ("connector={type: scripted, self: 1}", ("connector.self", "unknown option")),
    ("connector={type: scripted, name: x}", ("connector.name", "unknown option")),
    ("workload.requests.0.max_tokens=1" + "0" * 30, ("max_tokens", "<= 16777216")),
    ("workload.requests.0.priority=" + BIG, ("priority",)),
    ("actions=[{at: 0, evict: {prefix_of: r0, group: 0, blocks: [999]}}]", ("actions.0.evict.blocks", "block 999")),
    ("scheduler.watermark=.inf", ("watermark",)),
]
# Every hardware override key: infinity is refused, and so is a denormal where the key is a divisor.
HW = "model={preset: nemotron-h-8b}"
HW_KEYS = [
    "memory_bytes",
    "memory_bandwidth",
    "bf16_flops",
    "sm_count",
    "step_overhead_s",
    "per_request_overhead_s",
    "compute_efficiency",
    "memory_efficiency",
    "kernel_floor_s",
    "transition_k",
    "gemm_row_tile",
    "attn_prefill_efficiency",
    "attn_context_efficiency",
    "attn_prefill_token_s",
    "attn_decode_memory_efficiency",
    "attn_floor_s",
    "attn_decode_ctas_per_sm",
    "attn_decode_cta_bandwidth",
    "elementwise_memory_efficiency",
    "small_op_floor_s",
    "state_memory_efficiency",
    "state_floor_s",
]
TIME_SCENARIO = BASE.replace("clock: steps", "clock: time\nmodel: {preset: nemotron-h-8b}").replace(
    "cache: {block_size: 16, num_blocks: 50, groups: [full_attention, mamba]}", "cache: {num_blocks: 60}"
)


@pytest.mark.parametrize("override, fragments", NUMBER_CASES, ids=[c[0][:40] for c in NUMBER_CASES])
def test_numbers_out_of_range_are_refused_naming_the_key(override: str, fragments: tuple[str, ...]) -> None:
    line = assert_refused(invoke(["validate", BASE_YAML, "--set", override]), *fragments)
    assert BIG not in line  # a 400-digit number is not echoed whole


@pytest.mark.parametrize("key", sorted(set(HW_KEYS)))
@pytest.mark.parametrize("value", [".inf", ".nan", "1e-320", "1e308"])
def test_every_hardware_override_has_a_finite_range(tmp_path: Path, key: str, value: str) -> None:
    scenario = tmp_path / "hw.yaml"
    scenario.write_text(TIME_SCENARIO + f"hardware: {{preset: h100-80g, overrides: {{{key}: {value}}}}}\n")
    res = invoke(["validate", scenario])
    if res.exit_code == 0:  # a value inside the key's range (e.g. a denormal floor time of 1e-320 s) is fine
        assert value == "1e-320" and key.endswith("_s"), res.output
        return
    assert_refused(res, f"hardware.overrides.{key}")


def test_the_hardware_override_keys_are_all_listed() -> None:
    from sim.config.scenario import HardwareOverrides

    assert set(HW_KEYS) == set(HardwareOverrides.model_fields)


def test_validate_refuses_what_run_refuses(tmp_path: Path) -> None:
    override = "actions=[{at: 0, evict: {prefix_of: r0, group: 0, blocks: [999]}}]"
    ran = invoke(["run", BASE_YAML, "--set", override, "-o", tmp_path / "out", "-q", "--no-plots"])
    checked = invoke(["validate", BASE_YAML, "--set", override])
    assert_refused(ran, "block 999")
    assert_refused(checked, "block 999")


# ---------------------------------------------------------------- special files as input


def _special(tmp_path: Path, kind: str) -> Path:
    if kind == "fifo":
        path = tmp_path / "pipe.yaml"
        os.mkfifo(path)
        return path
    if kind == "dir":
        path = tmp_path / "dir.yaml"
        path.mkdir()
        return path
    return Path({"zero": "/dev/zero", "mem": "/proc/self/mem", "null": "/dev/null"}[kind])


SPECIAL = ["fifo", "dir", "zero", "mem"]
SPECIAL_COMMANDS: list[tuple[str, list[str]]] = [
    ("validate", ["validate", "{f}"]),
    ("run", ["run", "{f}", "-o", "{tmp}/out", "-q", "--no-plots"]),
    ("sweep-grid", ["sweep", str(BASE_YAML), "--grid-file", "{f}", "-o", "{tmp}/sw"]),
    ("stats", ["workload", "stats", "{f}"]),
    ("stats-azure", ["workload", "stats", "{f}", "--format", "azure"]),
    ("timing-overrides", ["timing", "check", str(PROFILE), "--hardware", "h100-80g", "--overrides", "{f}"]),
    ("trace", ["validate", "{tmp}/trace.yaml"]),
    ("empirical", ["validate", "{tmp}/empirical.yaml"]),
    ("overrides-path", ["validate", "{tmp}/overrides.yaml"]),
]


@pytest.mark.parametrize("kind", SPECIAL)
@pytest.mark.parametrize("name, args", SPECIAL_COMMANDS, ids=[c[0] for c in SPECIAL_COMMANDS])
def test_special_files_are_refused_in_one_line(tmp_path: Path, kind: str, name: str, args: list[str]) -> None:
    if kind == "mem" and not os.path.exists("/proc/self/mem"):
        pytest.skip("no /proc here")
    digest = plant_user_file(tmp_path)
    f = _special(tmp_path, kind)
    (tmp_path / "trace.yaml").write_text(
        "name: t\ncache: {block_size: 16, num_blocks: 500, groups: [full_attention]}\n"
        f"workload: {{trace: {{format: mooncake, path: '{f}'}}}}\n"
    )
    (tmp_path / "empirical.yaml").write_text(BASE)
    (tmp_path / "overrides.yaml").write_text(TIME_SCENARIO + f"hardware: {{preset: h100-80g, overrides_path: '{f}'}}\n")
    argv = [a.format(f=f, tmp=tmp_path) for a in args]
    if name == "empirical":
        dist = f"{{dist: empirical, path: '{f}'}}"
        argv += [
            "--set",
            "workload={generator: {arrivals: {process: poisson, rate: 1.0}, count: 5, "
            f"structure: {{kind: unique, prompt: {dist}}}, output: {{dist: fixed, value: 4}}}}}}",
        ]
    res = invoke(argv)
    assert_refused(res, str(f) if kind != "mem" else "/mem")  # workload stats names the resolved /proc/PID/mem
    assert "not a regular file" in res.stderr or "pseudo-file" in res.stderr or "not found" in res.stderr
    assert_user_file_kept(tmp_path, digest)


def test_a_grid_file_over_the_documented_8_mib_is_refused(tmp_path: Path) -> None:
    grid = tmp_path / "grid.yaml"
    grid.write_text("seed: [1]\n# " + "x" * (20 << 20) + "\n")
    assert_refused(
        invoke(["sweep", BASE_YAML, "--grid-file", grid, "-o", tmp_path / "sw"]), str(grid), "HYBRIDSIM_MAX_YAML_BYTES"
    )


def test_a_trace_line_of_200_mb_is_refused_after_16_mib(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    with open(trace, "wb") as fh:
        fh.write(b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1], "pad": "')
        fh.write(b"x" * (200 << 20))
        fh.write(b'"}\n')
    assert_refused(invoke(["workload", "stats", trace, "--limit", "10"]), f"{trace}:1", "HYBRIDSIM_MAX_LINE_BYTES")


def test_workload_stats_with_a_huge_output_length_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1000000000000000, "hash_ids": [1]}\n' * 20)
    assert_refused(invoke(["workload", "stats", trace, "--limit", "10"]), f"{trace}:1", "output_length")


# ---------------------------------------------------------------- kernel profiles


def _mutated_profile(tmp_path: Path, column: str, value: object) -> Path:
    folder = copy_profile(tmp_path / "profile")
    df = pd.read_csv(folder / "mlp.csv")
    if column == "medians":
        for c in df.columns:
            if c.endswith(".median"):
                df[c] = float("nan")
    else:
        df[column] = value
    df.to_csv(folder / "mlp.csv", index=False)
    return folder


PROFILE_CASES = [
    ("n_embd", "abc", "n_embd"),
    ("n_head", 0, "n_head"),
    ("n_head", 1e308, "n_head"),
    ("n_kv_head", 3, "must divide"),
    ("num_tokens", -5, "num_tokens"),
    ("time_stats.mlp_up_proj.median", "inf", "time_stats.mlp_up_proj.median"),
    ("medians", None, ".median"),
]


@pytest.mark.parametrize("column, value, fragment", PROFILE_CASES, ids=[f"{c[0]}={c[1]}" for c in PROFILE_CASES])
def test_timing_check_refuses_a_bad_profile(tmp_path: Path, column: str, value: object, fragment: str) -> None:
    folder = _mutated_profile(tmp_path, column, value)
    assert_refused(invoke(["timing", "check", folder, "--hardware", "h100-80g"]), "mlp.csv", fragment)


def test_timing_fit_refuses_all_nan_medians_and_writes_nothing(tmp_path: Path) -> None:
    pytest.importorskip("scipy")
    folder = _mutated_profile(tmp_path, "medians", None)
    out = tmp_path / "hw.yaml"
    assert_refused(invoke(["timing", "fit", folder, "--hardware", "h100-80g", "-o", out]), ".median")
    assert not out.exists()


@pytest.mark.parametrize("layers", ["1" + "0" * 30, "0", "100000"])
def test_timing_check_bounds_layers(layers: str) -> None:
    assert_refused(invoke(["timing", "check", PROFILE, "--hardware", "h100-80g", "--layers", layers]), "--layers")


def test_an_overrides_file_nested_20k_deep_is_refused(tmp_path: Path) -> None:
    deep = tmp_path / "deep.yaml"
    deep.write_text("overrides: " + "[" * 20000 + "]" * 20000 + "\n")
    assert_refused(invoke(["timing", "check", PROFILE, "--hardware", "h100-80g", "--overrides", deep]), "deep.yaml")
