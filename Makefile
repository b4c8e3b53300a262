# hybridsim: the commands a user needs. `make run` sets up and runs the default
# scenario end to end; `make test` runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SCENARIO ?= scenarios/demo-pressure.yaml
OUT    ?= results/demo-pressure

.PHONY: venv run test bench golden clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

run: venv
	$(VENV)/bin/hybridsim run $(SCENARIO) -o $(OUT)

test: venv
	$(PY) -m pytest -n 2 -p no:cacheprovider

bench: venv
	$(PY) benchmarks/bench.py

golden: venv
	$(VENV)/bin/hybridsim golden regenerate

clean:
	rm -rf $(VENV) results/demo-pressure
