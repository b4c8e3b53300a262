# hybridsim: the commands a user needs. `make run` sets up (runtime dependencies only) and runs the
# default scenario end to end; `make test` adds the test extras and runs the whole suite; `make test-fast`
# runs the unit tier (no end-to-end scenario runs); `make lint` runs ruff and mypy.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SCENARIO ?= scenarios/demo-pressure.yaml
OUT    ?= results/demo-pressure
# Extras `make test` / `make lint` install on top of the runtime (CI adds ray: EXTRAS=test,dev,ray).
EXTRAS ?= test,dev
# Files `ruff format --check` enforces: the modules written since the formatter was configured. The repo-wide
# `ruff format sim tests benchmarks` is a later, separate step; after it this becomes `sim tests benchmarks`.
FORMATTED ?= sim/api.py sim/interfaces.py sim/connector/protocol.py sim/results/__init__.py sim/results/finalize.py sim/results/write.py sim/sweep/batch.py sim/sweep/golden.py sim/sweep/divergence.py sim/trace/golden.py tests/support/__init__.py tests/sweep/test_batch.py tests/test_import_contract.py

.PHONY: venv venv-extras run test test-fast lint bench golden clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed-extras: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[$(EXTRAS)]'
	touch $@

venv: $(VENV)/.installed

venv-extras: $(VENV)/.installed-extras

run: venv
	$(VENV)/bin/hybridsim run $(SCENARIO) -o $(OUT)

test: venv-extras
	$(PY) -m pytest -n 2 -p no:cacheprovider

test-fast: venv-extras
	$(PY) -m pytest -m "not slow" -p no:cacheprovider

lint: venv-extras
	$(PY) -m ruff check sim tests benchmarks
	$(PY) -m mypy
	$(if $(FORMATTED),$(PY) -m ruff format --check $(FORMATTED))

bench: venv
	$(PY) benchmarks/bench.py

golden: venv
	$(VENV)/bin/hybridsim golden regenerate

clean:
	rm -rf $(VENV) results/demo-pressure
