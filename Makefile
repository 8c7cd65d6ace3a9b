# make demo: synthetic data -> tasks -> baselines, short DreamShard and AutoShard runs, then the baselines, TorchRec's planner,
# both learned methods and shardkit measured side by side on the same tasks, the hardware named.  make test: the test suite.
# Both create .venv and install what they need (torch 2.13.0 CPU, fbgemm-gpu-cpu 1.8.0, torchrec 1.8.0
# without its dependencies, so that the CUDA fbgemm-gpu never replaces the CPU build).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
DATA   := data/dlrm_datasets
TASKS  := data/dlrm_tasks_50
DEMO_ALGS := random,naive,dim_greedy,size_greedy,lookup_greedy,size_lookup_greedy
DEMO_MEASURED := random,size_greedy,dim_greedy,lookup_greedy,size_lookup_greedy

.PHONY: demo test install clean experiments anchors honest-margins results

install: $(STAMP)

$(STAMP): requirements.txt setup.py shardkit_scripts.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt pytest
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m pip install -q tensordict==0.15.3 pyre-extensions==0.0.32
	$(PY) -m pip install -q --no-deps torchrec==1.8.0
	touch $(STAMP)

# SHARDKIT_REQUIRE_TORCHREC=1: the TorchRec tests fail, rather than skip, when TorchRec cannot be imported
# (it is installed above, so a skip here would hide a broken install).
test: $(STAMP)
	SHARDKIT_REQUIRE_TORCHREC=1 $(PY) -m pytest -q tests

# The demo: synthetic data (856 tables, batch 4096), 50-table tasks, every baseline planned, short
# DreamShard and AutoShard trainings, then the baselines, TorchRec's planner, both learned methods and shardkit
# measured side by side on 4 logical devices (shardkit fits its cost model of this machine on the measurements
# the trainings left in the cache, measuring more of the training tables if it needs to, at most 60 s).
demo: $(STAMP)
	$(PY) tools/gen_dlrm_data.py --synthetic --out-dir $(DATA)
	$(PY) tools/gen_tasks.py --data-dir $(DATA) --T 50 --num-train 50 --num-test 10 --out-dir $(TASKS)
	$(PY) eval.py --alg $(DEMO_ALGS) --task-path $(TASKS)/test.txt --data-dir $(DATA) \
		--gpu-devices 0,1,2,3 --max-memory 5 --plan-only --quiet
	rm -rf models/demo_dreamshard
	$(PY) train_dreamshard.py --task-path $(TASKS)/train.txt --data-dir $(DATA) --gpu-devices 0,1,2,3 \
		--max-memory 5 --out-dir models/demo_dreamshard --num-iterations 3 --bench-steps 5 --rl-num-batches 20
	rm -rf models/demo_autoshard
	$(PY) train_autoshard.py --task-path $(TASKS)/train.txt --data-dir $(DATA) --gpu-devices 0,1,2,3 \
		--max-memory 5 --savedir models --xpid demo_autoshard --total-steps 20000 --time-limit 3 --bench-iters 3
	$(PY) eval.py --alg $(DEMO_MEASURED),torchrec,models/demo_dreamshard/best.pt,models/demo_autoshard/model.pt,shardkit \
		--task-path $(TASKS)/test.txt --data-dir $(DATA) --gpu-devices 0,1,2,3 --max-memory 5 --max-tasks 5 --quiet \
		--shardkit-calibrate 60 --task-set "DLRM-50 (4)" --out data/demo_results.jsonl

# The experiments: the paper-style results table and plots at the small scale (DLRM-20/50 on 4 devices,
# DLRM-40/80 on 8, 5 test tasks each, every algorithm incl. short training of the learned methods) and
# the planning-time/memory scaling benchmark, all written to results/ (see results/README.md).
# Then the cluster block: 400-table tasks on 4 hosts of 8 emulated H200s (results/cluster/; the
# exchange between hosts modelled at 50 GB/s per GPU, assumed). About an hour on a 2-core CPU for
# the first part, ~10 more for the cluster block. The synthetic dataset is generated first if there is none.
experiments: $(STAMP)
	test -f $(DATA)/table_configs.json -a -f $(DATA)/data.pt || $(PY) tools/gen_dlrm_data.py --synthetic --out-dir $(DATA)
	$(PY) tools/run_experiments.py --scale small --data-dir $(DATA) --out-dir results
	$(PY) tools/bench_planning.py --data-dir $(DATA) --out-dir results --models-dir models/experiments/small
	$(PY) tools/run_experiments.py --scale cluster --oracle emulated:h200 --devices-per-host 8 --max-memory 0.35 \
	    --algs random,lookup_greedy,size_lookup_greedy,torchrec,torchrec-tw,shardkit --torchrec-time 120 \
	    --torchrec-memory weights --shardkit-time 30 --batch-size 65536 --data-dir $(DATA) \
	    --out-dir results/cluster

# The learned anchors: DreamShard, AutoShard and NeuroShard trained with fixed seeds against the emulated
# H200 (held-out fit, batch 65536) on the 50 training tasks of DLRM-50 (4), into models/anchors/h200/ with
# MANIFEST.json (tools/train_anchors.py --help; about 25 minutes on a 2-core CPU).
anchors: $(STAMP)
	$(PY) tools/train_anchors.py

# The honest-margin records: every planner side by side on the emulated H200 (held-out judge) on the DLRM-50,
# DLRM-100 and NS test tasks, and shardkit's margins from them (the README's emulated table), into
# results/honest_margins/<today>/ (tools/honest_margins.py --help; about 10 minutes on a 2-core CPU, nothing
# else running: shardkit plans under a time budget).
honest-margins: $(STAMP)
	$(PY) tools/honest_margins.py

# The results tables of the README and docs/, regenerated from the records and manifests of results/<name>/
# (tools/report.py; results/README.md says what a manifest holds). Seconds.
results: $(STAMP)
	$(PY) tools/report.py

clean:
	rm -rf $(VENV) build *.egg-info
