"""The console-script entry (sim.entry): the signal handler is in place before the command line is imported."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from sim import entry
from sim.cli.exit_codes import ExitCode
from sim.startup import long_lived

ROOT = Path(__file__).resolve().parents[1]


def test_the_console_script_and_python_m_sim_go_through_the_entry() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    assert scripts["hybridsim"] == "sim.entry:main"
    assert "from sim.entry import main" in (ROOT / "sim" / "__main__.py").read_text(encoding="utf-8")


def test_importing_the_entry_loads_no_part_of_the_command_line() -> None:
    """Whatever the entry imports runs before the handler exists: only the standard library, sim.interrupts and
    sim.startup (the collector's start-up pause, standard library only)."""
    probe = (
        "import sys, sim.entry; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'typer', 'click', 'rich', 'numpy', 'pandas'} "
        "or (m.startswith('sim.') and m not in {'sim.entry', 'sim.interrupts', 'sim.startup'})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_start_up_exit_code_is_the_cli_s() -> None:
    assert entry.INTERRUPTED == ExitCode.INTERRUPTED


def test_the_collector_is_off_while_the_command_line_is_imported_and_on_for_the_command() -> None:
    """docs/speed.md: the import runs with the collector off, what it built is frozen, the command runs with the
    collector back on (a run's own pause is sim.engine.collector's), and everything alive at exit is frozen
    (the interpreter's final collection skipped). The command line here is a stand-in module."""
    probe = (
        "import atexit, builtins, gc, sys, types\n"
        "seen = []\n"
        "fake = types.ModuleType('sim.cli')\n"
        "fake.main = lambda: seen.append(('command', gc.isenabled(), gc.get_freeze_count() > 0))\n"
        "sys.modules['sim.cli'] = fake\n"
        "real_import = builtins.__import__\n"
        "def spy(name, *args, **kwargs):\n"
        "    if name == 'sim.cli':\n"
        "        seen.append(('import', gc.isenabled()))\n"
        "    return real_import(name, *args, **kwargs)\n"
        "from sim import entry\n"
        "registered = []\n"
        "atexit.register = lambda f, *a, **k: registered.append(f)\n"
        "builtins.__import__ = spy\n"
        "entry.main()\n"
        "builtins.__import__ = real_import\n"
        "print(seen, registered == [gc.freeze])\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[('import', False), ('command', True, True)] True", out.stdout + out.stderr


def test_long_lived_turns_the_collector_off_freezes_what_was_built_and_restores_the_state() -> None:
    import gc

    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            before = gc.get_freeze_count()
            with long_lived():
                assert not gc.isenabled()
                built = [[i] for i in range(1000)]
            assert gc.isenabled() is enabled
            assert gc.get_freeze_count() >= before + len(built)
        finally:
            gc.unfreeze()
            gc.enable()


def test_a_command_s_start_up_runs_next_to_no_collection() -> None:
    """docs/speed.md: typer's pydantic adapters, a command's own imports and the scenario's validators are built
    with the collector off (sim.startup.long_lived). Left on, ``validate`` ran about 90 collections of the growing
    heap (0.03-0.04 s); with it, about a dozen (what the interpreter's start and pydantic's plug-in scan run)."""
    probe = (
        "import gc, sys\n"
        "counts = [0, 0, 0]\n"
        "gc.callbacks.append(lambda phase, info: phase == 'start' and counts.__setitem__(info['generation'],"
        " counts[info['generation']] + 1))\n"
        "sys.argv = ['hybridsim', 'validate', 'benchmarks/scenarios/step-fa-1000.yaml']\n"
        "import atexit\n"
        "atexit.register(lambda: print(counts, file=sys.stderr))\n"
        "from sim.entry import main\n"
        "main()\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True)
    counts = [int(n) for n in out.stderr.strip().splitlines()[-1].strip("[]").split(",")]
    assert "ok (step-fa-1000)" in out.stdout
    assert sum(counts) <= 30 and counts[1] + counts[2] <= 2, (counts, out.stderr)


def _ending(body: str) -> subprocess.CompletedProcess:
    probe = (
        "import atexit, sys, threading, time\n"
        "from sim.startup import quick_exit\n"
        "class Torn:\n"
        "    def __del__(self):\n"
        "        sys.stdout.write(' torn-down')\n"
        "kept = Torn()\n"
        "atexit.register(lambda: sys.stdout.write(' handler'))\n"
        "sys.stdout.write('out')\n" + body
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)


def test_quick_exit_runs_the_exit_handlers_flushes_and_skips_the_teardown() -> None:
    done = _ending("quick_exit(3)\n")
    assert (done.returncode, done.stdout, done.stderr) == (3, "out handler", "")
    done = _ending("quick_exit(None)\n")
    assert (done.returncode, done.stdout) == (0, "out handler")


def test_quick_exit_leaves_the_exit_to_the_interpreter_when_it_would_differ() -> None:
    """A message to print, or another thread the interpreter would wait for: quick_exit returns, and the usual
    exit (with its teardown) follows."""
    done = _ending("quick_exit('bad thing')\nsys.exit('bad thing')\n")
    assert (done.returncode, done.stdout, done.stderr.strip()) == (1, "out handler torn-down", "bad thing")
    body = "threading.Thread(target=time.sleep, args=(0.3,)).start()\nquick_exit(0)\nsys.stdout.write(' back')\n"
    done = _ending(body)
    assert (done.returncode, done.stdout) == (0, "out back handler torn-down")


def test_run_and_validate_end_quickly_other_commands_do_not() -> None:
    """The commands that ask for the quick end (sim.startup.end_quickly) keep their output and exit code."""
    probe = (
        "import sys\n"
        "import sim.startup as s\n"
        "ended = []\n"
        "real = s.quick_exit\n"
        "def spy(code):\n"
        "    ended.append(code)\n"
        "    sys.stderr.write(f'quick {code}\\n')\n"
        "    real(code)\n"
        "s.quick_exit = spy\n"
        "import sim.entry\n"
        "sim.entry.quick_exit = spy\n"
        "sys.argv = ['hybridsim', *sys.argv[1:]]\n"
        "sim.entry.main()\n"
    )
    fa = "benchmarks/scenarios/step-fa-1000.yaml"
    done = subprocess.run([sys.executable, "-c", probe, "validate", fa], capture_output=True, text=True, cwd=ROOT)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, f"{fa}: ok (step-fa-1000)", "quick 0\n")
    done = subprocess.run(
        [sys.executable, "-c", probe, "validate", "missing.yaml"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 2 and done.stderr.endswith("quick 2\n"), done.stderr
    done = subprocess.run([sys.executable, "-c", probe, "scenarios"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0 and "quick" not in done.stderr and "golden-pressure" in done.stdout


def _threads_after_validate(blas_threads: str | None) -> int:
    """The process's thread count at exit of ``hybridsim validate`` (which imports numpy), with
    ``OPENBLAS_NUM_THREADS`` unset or set to ``blas_threads``."""
    probe = (
        "import atexit, os, sys\n"
        "sys.argv = ['hybridsim', 'validate', 'benchmarks/scenarios/step-fa-1000.yaml']\n"
        "atexit.register(lambda: print('numpy' in sys.modules, len(os.listdir('/proc/self/task')), file=sys.stderr))\n"
        "from sim.entry import main\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if blas_threads is not None:
        env["OPENBLAS_NUM_THREADS"] = blas_threads
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, check=True)
    numpy_loaded, threads = out.stderr.strip().splitlines()[-1].split()
    assert numpy_loaded == "True", "validate no longer imports numpy: this test checks nothing"
    return int(threads)


@pytest.mark.skipif(not Path("/proc/self/task").exists() or (os.cpu_count() or 1) < 2, reason="Linux, 2+ cores")
def test_openblas_runs_one_thread_unless_the_user_asks_for_more() -> None:
    """sim.entry.limit_blas_threads: OpenBLAS's spinning thread per core cost every command 0.12 s of CPU."""
    assert _threads_after_validate(None) == 1
    assert _threads_after_validate("2") == 2
