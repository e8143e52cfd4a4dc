# make test | demo | bench | lint | fix — each works on a fresh machine with only python3.
VENV := .venv
PY := $(VENV)/bin/python
SRC := $(wildcard tenplex tests bench demo fixtures experiments examples docs/architecture.py)

.PHONY: test lint fix demo bench deps constraints

# (Re)install only when pyproject.toml or constraints.txt changed since the last install: the
# package's compatible ranges, resolved to the exact tested versions of constraints.txt.
$(VENV)/.stamp: pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	DS_BUILD_OPS=0 $(PY) -m pip install -q -c constraints.txt -e '.[test,lint,torch,ucx,plots,proofs,peers]'
	touch $@

# After changing dependencies in pyproject.toml: resolve them again and pin what installed
# (torch stays at TORCH: an unpinned torch resolves to several GB of CUDA wheels).
TORCH := 2.13.0
constraints: $(VENV)/.stamp
	DS_BUILD_OPS=0 $(PY) -m pip install -q -U -e '.[test,lint,torch,ucx,plots,proofs,peers]' 'torch==$(TORCH)'
	{ sed -n '1,3p' constraints.txt; $(PY) -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > constraints.tmp
	mv constraints.tmp constraints.txt

deps: $(VENV)/.stamp
	@command -v fusermount3 >/dev/null || (apt-get update -qq && apt-get install -y -qq fuse3) >/dev/null 2>&1 \
		|| echo "warning: could not install fuse3; the FUSE tests will be skipped"
	@command -v tc >/dev/null || (apt-get update -qq && apt-get install -y -qq iproute2) >/dev/null 2>&1 \
		|| echo "warning: could not install iproute2; the network-namespace tests will be skipped"

lint: deps
	$(VENV)/bin/ruff check $(SRC)
	$(VENV)/bin/lint-imports

# The suite runs on JOBS pytest-xdist workers; an idle worker takes tests from a busy one, and
# files with more slow tests start first (tests/conftest.py). JOBS=0 runs it in one process.
JOBS ?= 2
test: lint
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -p no:cacheprovider -q -n $(JOBS) --dist worksteal

demo: deps
	$(PY) -m demo

bench: deps
	$(PY) -m bench

fix: deps
	$(VENV)/bin/ruff check --fix $(SRC)
