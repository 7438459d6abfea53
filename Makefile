# rlfarm — `make run` and `make test` do all set-up themselves on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=
# xdist workers for `make test` (0: one process). Two overlap the suite's waits (Ray start-up, deadlines, restarts,
# Slurm) on the 2-core CI machine. A module's tests run on one worker, the longest modules first (tests/conftest.py;
# --no-loadscope-reorder keeps that order).
TEST_WORKERS ?= 2

.PHONY: help install run test test-fast clean
help:            ## list targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh $(PYTHON) $(VENV)
	touch $(STAMP)

install: $(STAMP) ## create .venv with torch (CPU build on CPU machines), the project and test deps

run: $(STAMP)    ## train the embedded default (SAC on Pendulum, env reward, local topology); extra overrides via ARGS=
	$(BIN)/rlfarm train $(ARGS)

test: $(STAMP)   ## all tests except GPU-only ones (slow learning tests included)
	$(BIN)/python -m pytest -m "not gpu" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

test-fast: $(STAMP) ## skip slow learning tests too
	$(BIN)/python -m pytest -m "not gpu and not slow" -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(ARGS)

clean:           ## remove the venv and run outputs
	rm -rf $(VENV) runs multirun outputs
