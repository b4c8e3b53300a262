from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.sweep.grid import (
    Axis,
    SeedSpec,
    SweepError,
    SweepSpec,
    build_sweep,
    is_grid_file,
    load_grid_file,
    parse_grid_arg,
    parse_seeds,
    plan_runs,
    run_id_for,
    yaml_text,
)


def test_grid_arg_values_are_yaml_and_commas_inside_brackets_and_quotes_are_kept():
    axis = parse_grid_arg(
        "cache.groups=[full_attention,mamba],[full_attention, {type: mamba, prefill_checkpoints: true}]"
    )
    assert axis.keys == ("cache.groups",)
    assert axis.points == (
        (["full_attention", "mamba"],),
        (["full_attention", {"type": "mamba", "prefill_checkpoints": True}],),
    )
    axis = parse_grid_arg("cache.retention_interval=null,0, 64,'a,b',it's")
    assert axis.points == ((None,), (0,), (64,), ("a,b",), ("it's",))
    assert parse_grid_arg("x.y='it''s,fine',\"q\\\",r\"").points == (("it's,fine",), ('q",r',))


@pytest.mark.parametrize(
    "item, message",
    [
        ("cache.num_blocks", "expected key.path=v1,v2"),
        ("cache..num_blocks=1", "is not a scenario key path"),
        ("=1,2", "is not a scenario key path"),
        ("seed=1,2", "'seed' cannot be a grid key"),
        ("cache.num_blocks=400,,800", "value 2 is empty"),
        ("cache.num_blocks=", "value 1 is empty"),
        ("cache.num_blocks=400,800,400", "value 400 is given twice"),
        ("cache.groups=[a,b", "unbalanced bracket"),
        ("x.y='abc", "unbalanced quote"),
        ("x.y={a: 1, a: }: 2", "not valid YAML"),
    ],
)
def test_grid_arg_errors_name_the_item(item, message):
    with pytest.raises(SweepError) as err:
        parse_grid_arg(item)
    assert message in str(err.value)
    assert repr(item) in str(err.value)


def test_seeds_count_list_and_errors():
    assert parse_seeds(None) == SeedSpec(count=1)
    assert parse_seeds("3") == SeedSpec(count=3)
    assert parse_seeds(3).resolve(7) == (7, 8, 9)
    assert parse_seeds("1,2,5").resolve(7) == (1, 2, 5)
    assert parse_seeds("42,").resolve(7) == (42,)
    assert parse_seeds([5, 6]).resolve(0) == (5, 6)
    for bad, message in [
        ("0", "count must be >= 1"),
        ("three", "expected a count"),
        ("1,1", "must be distinct"),
        ("1,-2", "non-negative integers"),
        ([], "non-empty list"),
        (True, "expected a count"),
    ]:
        with pytest.raises(SweepError, match=message):
            parse_seeds(bad)


def test_yaml_text_round_trips_values_that_look_like_other_types():
    for value in ["400", "yes", "null", "pr48425", "a b", 400, 0.5, True, None, [1, "2"], {"type": "mamba"}]:
        assert yaml.safe_load(yaml_text(value)) == value
    assert yaml_text("pr48425") == "pr48425"
    assert yaml_text("400") == "'400'"
    assert yaml_text(None) == "null"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_grid_file_order_zip_seeds_plots_and_relative_scenario(tmp_path, base_scenario):
    grid = _write(
        tmp_path / "sub_grid.yaml",
        "scenario: base.yaml\n"
        "cache.num_blocks: [400, 800]\n"
        "zip:\n"
        "  - {connector.type: [none, scripted], connector.supports_hma: [false, true]}\n"
        "scheduler.prefix_policy: [pr48425]\n"
        "seeds: [3, 4]\n"
        "plots:\n"
        "  - {name: div, x: cache.num_blocks, hue: connector.type, metrics: [divergences]}\n",
    )
    parsed = load_grid_file(grid)
    assert parsed.scenario == tmp_path / "base.yaml"
    assert [a.keys for a in parsed.axes] == [
        ("cache.num_blocks",),
        ("connector.type", "connector.supports_hma"),
        ("scheduler.prefix_policy",),
    ]
    assert parsed.axes[1].points == (("none", False), ("scripted", True))
    assert parsed.seeds == SeedSpec(count=None, values=(3, 4))
    assert parsed.plots[0].metrics == ("divergences",)


@pytest.mark.parametrize(
    "text, message",
    [
        ("- a\n", "a grid file is a mapping"),
        ("cache.num_blocks: 400\n", "cache.num_blocks: expected a non-empty list of values, got 400"),
        ("cache.num_blocks: []\n", "cache.num_blocks: expected a non-empty list"),
        ("cache.num_blocks: [1, 1]\n", "value 1 is given twice"),
        ("zip: [{a.b: [1, 2], c.d: [1]}]\n", "zip[0]: lists vary together and must have equal lengths"),
        ("zip: {a.b: [1]}\n", "'zip' must be a list of mappings"),
        ("seeds: 0\n", "count must be >= 1"),
        ("plots: [{name: p, x: a, metrics: [m], colour: red}]\n", "plots[0]: unknown key 'colour'"),
        ("plots: [{name: 'a/b', x: a, metrics: [m]}]\n", "plots[0]: 'name' must be a file-name-safe string"),
        ("plots: [{name: p, x: a, metrics: []}]\n", "plots[0]: 'metrics' must be a non-empty list"),
        ("a: [1]\n  b: [2\n", "grid.yaml:"),
        ("bad key: [1]\n", "'bad key' is not a scenario key path"),
        # The scenario's bounded loader reads grid files too: no code tags, no duplicate keys, no alias bombs.
        ("a.b: !!python/object/apply:os.system [echo]\n", "grid.yaml:1: a.b: tag !!python/object/apply:os.system"),
        ("a.b: [1]\na.b: [2]\n", "grid.yaml:2: a.b: duplicate key"),
        (
            "x: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
            + "".join(
                f"x{i + 1}: &a{i + 1} [*{'a' if i == 0 else f'a{i}'}, *{'a' if i == 0 else f'a{i}'}]\n"
                for i in range(25)
            ),
            "HYBRIDSIM_MAX_YAML_NODES",
        ),
    ],
)
def test_grid_file_errors_name_the_file_and_item(tmp_path, text, message):
    path = _write(tmp_path / "grid.yaml", text)
    with pytest.raises(SweepError) as err:
        load_grid_file(path)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_a_grid_file_over_the_yaml_size_limit_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setenv("HYBRIDSIM_MAX_YAML_BYTES", "64")
    path = _write(tmp_path / "big.yaml", "cache.num_blocks: [" + ", ".join(["1"] * 40) + "]\n")
    with pytest.raises(SweepError, match=r"big\.yaml: cannot read sweep file: .*HYBRIDSIM_MAX_YAML_BYTES"):
        load_grid_file(path)
    assert not is_grid_file(path)


def test_build_sweep_combines_file_and_cli_axes_and_cli_seeds_win(tmp_path, base_scenario):
    grid = _write(tmp_path / "g.yaml", "cache.num_blocks: [400, 800]\nseeds: 5\n")
    spec = build_sweep(base_scenario, ["scheduler.prefix_policy=pr48425,max_per_group"], grid, "2")
    assert spec.scenario == base_scenario
    assert spec.keys == ("cache.num_blocks", "scheduler.prefix_policy")
    assert spec.seeds == SeedSpec(count=2)
    assert build_sweep(base_scenario, [], grid).seeds == SeedSpec(count=5)


def test_build_sweep_accepts_a_grid_file_as_the_scenario_argument(tmp_path, base_scenario):
    sweep_file = _write(tmp_path / "s.yaml", "scenario: base.yaml\ncache.num_blocks: [1, 2]\n")
    spec = build_sweep(sweep_file)
    assert spec.scenario == base_scenario
    with pytest.raises(SweepError, match="pass either it or --grid-file"):
        build_sweep(sweep_file, grid_file=sweep_file)


def test_build_sweep_errors(tmp_path, base_scenario):
    grid = _write(tmp_path / "g.yaml", "cache.num_blocks: [400, 800]\n")
    with pytest.raises(SweepError, match="'cache.num_blocks' is given more than once"):
        build_sweep(base_scenario, ["cache.num_blocks=1,2"], grid)
    with pytest.raises(SweepError, match="does not exist"):
        build_sweep(tmp_path / "missing.yaml")
    plotted = _write(
        tmp_path / "p.yaml", "cache.num_blocks: [1, 2]\nplots: [{name: p, x: cache.block_size, metrics: [m]}]\n"
    )
    with pytest.raises(SweepError, match="plot 'p': x 'cache.block_size' is not a grid key"):
        build_sweep(base_scenario, [], plotted)


def test_plan_runs_is_the_product_first_axis_outermost_seeds_innermost(base_scenario):
    spec = SweepSpec(
        scenario=base_scenario,
        axes=(parse_grid_arg("cache.num_blocks=400,800"), parse_grid_arg("scheduler.prefix_policy=pr48425,'400'")),
        seeds=SeedSpec(count=2),
    )
    runs = plan_runs(spec, base_seed=7)
    assert [r.run_id for r in runs] == [
        "cache.num_blocks=400__scheduler.prefix_policy=pr48425__seed=7",
        "cache.num_blocks=400__scheduler.prefix_policy=pr48425__seed=8",
        "cache.num_blocks=400__scheduler.prefix_policy=400__seed=7",
        "cache.num_blocks=400__scheduler.prefix_policy=400__seed=8",
        "cache.num_blocks=800__scheduler.prefix_policy=pr48425__seed=7",
        "cache.num_blocks=800__scheduler.prefix_policy=pr48425__seed=8",
        "cache.num_blocks=800__scheduler.prefix_policy=400__seed=7",
        "cache.num_blocks=800__scheduler.prefix_policy=400__seed=8",
    ]
    assert runs[2].overrides == ("cache.num_blocks=400", "scheduler.prefix_policy='400'", "seed=7")
    assert runs[2].values == (("cache.num_blocks", 400), ("scheduler.prefix_policy", "400"))
    assert [r.run_id for r in plan_runs(SweepSpec(scenario=base_scenario), 3)] == ["seed=3"]


def test_run_ids_are_filesystem_safe_unique_and_stable():
    plain = run_id_for([("cache.groups", ["full_attention", "mamba"])], 1)
    other = run_id_for([("cache.groups", ["full_attention", "sliding_window"])], 1)
    assert plain.startswith("cache.groups=-full_attention--mamba-__seed=1__")
    assert len(plain.rsplit("__", 1)[1]) == 8
    assert plain != other
    assert run_id_for([("cache.groups", ["full_attention", "mamba"])], 1) == plain
    assert all(ch.isalnum() or ch in "._=+-" for ch in plain + other)
    long_id = run_id_for([("workload.name", "x" * 400)], 1)
    assert len(long_id) <= 160


def test_case_only_run_id_collision_is_an_error(base_scenario):
    spec = SweepSpec(scenario=base_scenario, axes=(Axis(("a.b",), (("X",), ("x",))),))
    with pytest.raises(SweepError, match="differ only in case"):
        plan_runs(spec, 0)


def test_set_entries_apply_to_every_run_before_the_grid_and_cli_set_replaces_file_set(tmp_path, base_scenario):
    grid = _write(
        tmp_path / "g.yaml",
        "set: {outputs.plots: false, scheduler.max_num_seqs: 2}\ncache.num_blocks: [400]\n",
    )
    spec = build_sweep(base_scenario, [], grid, overrides=["scheduler.max_num_seqs=4", "connector.holds={a: 1, b: 2}"])
    assert spec.fixed == (
        ("outputs.plots", False),
        ("scheduler.max_num_seqs", 4),
        ("connector.holds", {"a": 1, "b": 2}),
    )
    (run,) = plan_runs(spec, 7)
    assert run.run_id == "cache.num_blocks=400__seed=7"  # fixed overrides are not part of the id
    assert run.overrides == (
        "outputs.plots=false",
        "scheduler.max_num_seqs=4",
        "connector.holds={a: 1, b: 2}",
        "cache.num_blocks=400",
        "seed=7",
    )
    with pytest.raises(SweepError, match="'cache.num_blocks' is both set for every run and a grid key"):
        build_sweep(base_scenario, [], grid, overrides=["cache.num_blocks=1"])
    with pytest.raises(SweepError, match="--set 'nokey': expected key.path=value"):
        build_sweep(base_scenario, overrides=["nokey"])
    with pytest.raises(SweepError, match="'set' must be a mapping"):
        load_grid_file(_write(tmp_path / "bad.yaml", "set: [a]\n"))


def test_plot_spec_missing_and_title_are_validated(tmp_path):
    ok = load_grid_file(
        _write(tmp_path / "g.yaml", "a.b: [1]\nplots: [{name: p, x: a.b, metrics: [m], missing: 0, title: T}]\n")
    )
    assert (ok.plots[0].missing, ok.plots[0].title) == (0, "T")
    with pytest.raises(SweepError, match="'missing' must be a number"):
        load_grid_file(_write(tmp_path / "b.yaml", "plots: [{name: p, x: a.b, metrics: [m], missing: none}]\n"))
