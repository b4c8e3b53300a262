"""``hybridsim timing check|fit PROFILE_DIR``: the step-time model against a Vidur-format kernel profile.

Bad input (no such directory, a CSV without Vidur's columns, an unknown
hardware preset, an unreadable overrides file) prints one line naming it and
exits 2.
"""

# No ``from __future__ import annotations`` here: typer evaluates every command's parameter annotations, which
# strings would make a compile and an eval each (about 0.003 s of every command, docs/speed.md).

from dataclasses import replace
from pathlib import Path

import typer

from sim.cli.app import timing_app
from sim.cli.errors import fail
from sim.cli.exit_codes import ExitCode
from sim.cli.output import force_option, warn

_HARDWARE = typer.Option(..., "--hardware", help="Hardware preset the profile was taken on (a100-80g, h100-80g, ...).")
_LAYERS = typer.Option(32, "--layers", help="Decoder layers of the profiled model (Vidur's CSVs do not say).")
_KV_SAVE = typer.Option(
    False,
    "--prefill-kv-save/--no-prefill-kv-save",
    help="Count the profile's prefill attn_kv_cache_save (off: a profiler artefact, see docs).",
)


def _setup(profile_dir: Path, hardware: str, layers: int, prefill_kv_save: bool):
    from sim.config.presets import hardware_preset
    from sim.timing.profiles import ProfileError, check_layers, load_profile, profiled_steps

    try:
        hw = hardware_preset(hardware)
    except ValueError as exc:
        fail(f"--hardware: {exc}")
    try:
        check_layers(layers)
        profile = load_profile(profile_dir)
    except ProfileError as exc:
        fail(str(exc))
    steps = profiled_steps(profile, layers, include_prefill_kv_save=prefill_kv_save)
    if not steps:
        fail(f"{profile_dir}: no step can be priced (no attention row matches a profiled token count)")
    return hw, profile, profile.model(layers), steps


@timing_app.command("check")
def check(
    profile_dir: Path = typer.Argument(..., help="Directory with Vidur's mlp.csv (and attention.csv)."),
    hardware: str = _HARDWARE,
    layers: int = _LAYERS,
    overrides: Path | None = typer.Option(None, "--overrides", help="A hw.yaml written by `timing fit`."),
    prefill_kv_save: bool = _KV_SAVE,
    summary: bool = typer.Option(False, "--summary", help="Print only the per-regime summary."),
) -> None:
    """Predicted vs profiled time per step, error, and MAPE per regime (prefill, decode, mixed)."""
    from sim.config.scenario import read_overrides_file
    from sim.engine.timing import StepTimeModel
    from sim.timing.check import compare, format_table, summarize

    hw, profile, model, steps = _setup(profile_dir, hardware, layers, prefill_kv_save)
    given = {}
    if overrides is not None:
        try:
            given = read_overrides_file(str(overrides)).given()
        except ValueError as exc:
            fail(f"--overrides: {str(exc).removeprefix('@overrides_path: ')}")
    st = StepTimeModel.from_presets(model, hw, given)
    rows = compare(st, steps)
    typer.echo(
        f"profile {profile_dir} on {hw.name}, {layers} layers"
        + ("" if profile.attention is not None else " (no attention.csv: linear and small ops only)")
    )
    typer.echo(format_table(rows, summarize(rows), steps=not summary))


@timing_app.command("fit")
def fit(
    profile_dir: Path = typer.Argument(..., help="Directory with Vidur's mlp.csv (and attention.csv)."),
    output: Path = typer.Option(..., "-o", "--output", help="Write the fitted hardware overrides here (YAML)."),
    hardware: str = _HARDWARE,
    layers: int = _LAYERS,
    prefill_kv_save: bool = _KV_SAVE,
    force: bool = force_option(),
) -> None:
    """Fit the efficiencies and floors to the profile; write a file for ``hardware.overrides_path``."""
    import yaml

    from sim.engine.timing import CALIBRATED, StepTimeModel, TimingParams
    from sim.timing.check import compare, format_table, summarize
    from sim.timing.fit import fit_profile, override_document
    from sim.trace.output import OutputPathError, OutputWriteError, check_output_file, write_file

    try:
        import scipy.optimize  # noqa: F401  (the fit's least-squares polish)
    except ImportError:
        fail("timing fit needs SciPy, an optional dependency: pip install 'hybridsim[fit]' (or pip install scipy)")
    try:
        check_output_file(output, force=force, option="-o/--output")
    except OutputPathError as exc:
        fail(str(exc))
    except OutputWriteError as exc:
        fail(exc.strerror or str(exc), ExitCode.WRITE_FAILED)
    hw, profile, model, steps = _setup(profile_dir, hardware, layers, prefill_kv_save)
    start = CALIBRATED.get(hw.name, TimingParams())
    result = fit_profile(profile, model, hw, steps, start=start)
    doc = override_document(result, hw, str(profile_dir))
    notes: list[str] = []
    from sim.shrink.output import comment_text

    use = f"hardware: {{preset: {hw.name}, overrides_path: {output.name}}}"
    text = f"# hybridsim timing fit: use as `{comment_text(use)}`\n"
    try:
        write_file(output, text + yaml.safe_dump(doc, sort_keys=False), force=force, notes=notes, option="-o/--output")
    except OutputPathError as exc:
        fail(str(exc))
    except OutputWriteError as exc:
        fail(exc.strerror or str(exc), ExitCode.WRITE_FAILED)
    warn(notes)
    for g in result.groups:
        typer.echo(f"fitted {g.name}: {g.observations} rows, rms log error {g.rms_log_error:.3f}")
    fitted = replace(start, **doc["overrides"])
    rows = compare(StepTimeModel(model, hw, fitted), steps)
    typer.echo(format_table(rows, summarize(rows), steps=False))
    typer.echo(f"wrote {output}")
