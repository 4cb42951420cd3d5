# The two commands a fresh clone needs (README): `make demo` and `make test`.
# Each creates .venv when missing and installs everything from this repository's own files.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.jenga-install-stamp
JOBS ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: install demo test test-full lint typecheck check clean tiny-model tiny-spec e2e-cpu sessions-cpu e2e-models accelerate unaccelerate \
	scale-tp scale-dp scale-dp-full window-events speculative-cpu pd-cpu pd-cpu-tp

# The compiled build (below) comes with the install where mypyc and a C compiler are present;
# after a source edit it is stale and set aside (pure Python, with a warning) until rebuilt.
install: $(STAMP)
	@test -f jenga_sglang/_compiled.stamp || $(PY) scripts/build_compiled.py

$(STAMP): pyproject.toml scripts/install-cpu.sh
	bash scripts/install-cpu.sh

demo: install tiny-model
	$(PY) -m jenga_sglang.bench.cli.demo

test: install
	$(PY) -m pytest -q -p no:cacheprovider

# The long live variants `make test` skips (tests marked `full`: another Mamba2 family, the
# load test's no_buffer strategy, the host tier at page 16, with int8 checkpoints and on the
# tiny gpt-oss, stock HiCache through the CPU test shim); about 14 minutes on 2 cores.
test-full: install tiny-model
	$(PY) -m pytest -q -p no:cacheprovider --full -m full

# Compile the tree, policies and replay loops with mypyc, in place (about 1 minute on 2 cores;
# same decisions, about 3x faster replays, a cheaper cache on SGLang's scheduler thread;
# docs/install.md). `make install` runs it once; run it again after editing those modules.
# Skipped, with the reason, when mypyc or a C compiler is missing. `unaccelerate` goes back to
# pure Python.
accelerate: install
	$(PY) scripts/build_compiled.py

unaccelerate:
	$(PY) scripts/build_compiled.py --clean

# A tiny NemotronH (random weights, locally trained tokenizer) for serving on CPU (docs/e2e-cpu.md).
tiny-model: data/tiny-model/model.safetensors

data/tiny-model/model.safetensors: scripts/make_tiny_model.py | $(STAMP)
	$(PY) scripts/make_tiny_model.py --out data/tiny-model

# Speculative decoding's tiny models (scripts/make_tiny_spec.py): the tiny NemotronH made quiet
# but for its attention layer (data/tiny-spec/target), that layer as a STANDALONE draft (draft/)
# and an EAGLE head (eagle/), and the target with it as its own MTP layer (mtp/, for NEXTN).
tiny-spec: data/tiny-spec/target/model.safetensors

data/tiny-spec/target/model.safetensors: scripts/make_tiny_spec.py data/tiny-model/model.safetensors
	$(PY) scripts/make_tiny_spec.py --target data/tiny-model --out data/tiny-spec

# Serve the tiny model with SGLang on CPU, stock and with --enable-jenga; one JSON summary
# (docs/e2e-cpu.md). About 10 minutes on 2 cores.
e2e-cpu: tiny-model
	$(PY) -m jenga_sglang.bench.studies.e2e_cpu --model data/tiny-model --out out/e2e

# SGLang's session radix cache against our agent path: the tiny model serves one agent replay,
# every conversation an SGLang session, stock and --enable-jenga, each without and with
# --enable-session-radix-cache, and our tree on SGLang's pools, under one KV budget
# (bench/RESULTS.md "Serving: sessions"). About 15 minutes.
sessions-cpu: tiny-model
	$(PY) -m jenga_sglang.bench.studies.sessions_cpu --model data/tiny-model --out out/sessions

# Every tiny model family (bench/drivers/tiny_families.py) served stock and with --enable-jenga on CPU,
# at page 1, and one family of each cache kind at --page-size 16; out/e2e-models/summary.json and a
# table (docs/models.md). Builds missing models under data/. About 30 minutes on 2 cores.
e2e-models: install
	$(PY) -m jenga_sglang.bench.studies.e2e_models --out out/e2e-models
	$(PY) -m jenga_sglang.bench.studies.e2e_models --families nemotron_h,qwen3_5,gpt_oss \
	    --page-sizes 16 --update --out out/e2e-models

# Scale-out on CPU (docs/sglang.md, "Tensor and data parallelism"; bench/RESULTS.md): the tiny model
# at --tp-size 2, stock and --enable-jenga, with SGLang's rank-consensus checker on (about 15
# minutes on 2 cores); and two replicas behind smg, cache-aware routing against round robin,
# jenga against stock: `scale-dp` on the shared-system-prompt load, where the routers' views
# differ (about 12 minutes), `scale-dp-full` on the chat and agent loads as well (about 40).
scale-tp: tiny-model
	$(PY) -m jenga_sglang.bench.studies.scale_tp --model data/tiny-model --out out/scale-tp

scale-dp: tiny-model
	$(PY) -m jenga_sglang.bench.studies.scale_dp --model data/tiny-model --workloads system \
	    --out out/scale-dp

scale-dp-full: tiny-model
	$(PY) -m jenga_sglang.bench.studies.scale_dp --model data/tiny-model --out out/scale-dp-full

# A sliding-window worker's KV events (the tiny gpt-oss, stock and --enable-jenga) read into a
# model of smg's block index, against the hits the worker reports (about 20 minutes).
window-events: data/tiny-gpt_oss/model.safetensors
	$(PY) -m jenga_sglang.bench.studies.window_events --model data/tiny-gpt_oss \
	    --out out/window-events

# Speculative decoding, stock and --enable-jenga (Jenga pool), both Mamba strategies: NGRAM on the
# tiny NemotronH, then STANDALONE, EAGLE and NEXTN on make tiny-spec's models: outputs,
# acceptance and cached tokens side by side (about an hour).
speculative-cpu: tiny-model tiny-spec
	$(PY) -m jenga_sglang.bench.studies.speculative_cpu --model data/tiny-model \
	    --algorithm ngram --out out/speculative-cpu
	$(PY) -m jenga_sglang.bench.studies.speculative_cpu --model data/tiny-spec/target \
	    --algorithm standalone --draft-model data/tiny-spec/draft --out out/speculative-cpu
	$(PY) -m jenga_sglang.bench.studies.speculative_cpu --model data/tiny-spec/target \
	    --algorithm eagle --draft-model data/tiny-spec/eagle --out out/speculative-cpu
	$(PY) -m jenga_sglang.bench.studies.speculative_cpu --model data/tiny-spec/mtp \
	    --algorithm nextn --out out/speculative-cpu

# Prefill-decode disaggregation on the tiny NemotronH, stock and jenga (the pool on both sides,
# our tree over SGLang's pools, the decode side's own radix cache), SGLang's Mooncake backend
# over the TCP stand-in of jenga_sglang/cpu_transfer.py: replies against one stock server,
# cached tokens on each side, bytes moved, aborts first (about 17 minutes).
pd-cpu: tiny-model
	$(PY) -m jenga_sglang.bench.studies.pd_cpu --model data/tiny-model --out out/pd-cpu

# The same with two tensor-parallel ranks per server on both sides (about 14 minutes).
pd-cpu-tp: tiny-model
	$(PY) -m jenga_sglang.bench.studies.pd_cpu --model data/tiny-model --tp 2 \
	    --variants stock,jenga,jenga-decode-tree --out out/pd-cpu-tp

data/tiny-gpt_oss/model.safetensors: scripts/make_tiny_model.py | $(STAMP)
	$(PY) scripts/make_tiny_model.py --family gpt_oss --out data/tiny-gpt_oss

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

check: lint typecheck test

clean:
	rm -f jenga_sglang/*.so radix/*.so policies/*.so bench/*/*.so jenga_sglang/_compiled.stamp
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
