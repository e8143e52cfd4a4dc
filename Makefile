# make test | demo | bench | lint | fix — each works on a fresh machine with only python3.
VENV := .venv
PY := $(VENV)/bin/python
SRC := $(wildcard tenplex tests proofs bench demo fixtures experiments)

.PHONY: test lint fix demo bench deps

# (Re)install only when pyproject.toml changed since the last install.
$(VENV)/.stamp: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test,lint,torch,ucx]'
	touch $@

deps: $(VENV)/.stamp
	@command -v fusermount3 >/dev/null || (apt-get update -qq && apt-get install -y -qq fuse3) >/dev/null 2>&1 \
		|| echo "warning: could not install fuse3; the FUSE tests will be skipped"
	@command -v tc >/dev/null || (apt-get update -qq && apt-get install -y -qq iproute2) >/dev/null 2>&1 \
		|| echo "warning: could not install iproute2; the network-namespace tests will be skipped"

lint: deps
	$(VENV)/bin/ruff check $(SRC)
	$(VENV)/bin/lint-imports

test: lint
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -p no:cacheprovider -q

demo: deps
	$(PY) -m demo

bench: deps
	$(PY) -m bench

fix: deps
	$(VENV)/bin/ruff check --fix $(SRC)
