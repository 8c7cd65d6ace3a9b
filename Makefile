# make demo: synthetic data -> tasks -> every baseline side by side.  make test: the test suite.
# Both create .venv and install what they need (torch 2.13.0 CPU, fbgemm-gpu-cpu 1.8.0, torchrec 1.8.0
# without its dependencies, so that the CUDA fbgemm-gpu never replaces the CPU build).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DATA   := data/dlrm_datasets
TASKS  := data/dlrm_tasks_50
DEMO_ALGS := random,naive,dim_greedy,size_greedy,lookup_greedy,size_lookup_greedy

.PHONY: demo test install clean

install: $(STAMP)

$(STAMP): requirements.txt setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt pytest
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip install -q tensordict==0.15.3 pyre-extensions==0.0.32
	$(PY) -m pip install -q --no-deps torchrec==1.8.0
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q tests

demo: $(STAMP)
	$(PY) tools/gen_dlrm_data.py --synthetic --out-dir $(DATA)
	$(PY) tools/gen_tasks.py --data-dir $(DATA) --T 50 --num-train 50 --num-test 10 --out-dir $(TASKS)
	$(PY) eval.py --alg $(DEMO_ALGS) --task-path $(TASKS)/test.txt --data-dir $(DATA) \
		--gpu-devices 0,1,2,3 --max-memory 5 --plan-only --quiet --out data/demo_plans.jsonl

clean:
	rm -rf $(VENV) build *.egg-info
