# rocwheels: every target creates/uses the project venv itself.
#   make demo                        canary: build -> repair -> verify -> publish -> install, in build/demo/
#   make lint                        ruff (lint, format) and mypy on pipeline/; make test runs it first
#   make test                        the test suite (installs hipcc/podman when missing, as root)
#   make wheels ARCH=gfx942          build, repair and verify every recipe of the lock line
#   make wheels ARCH=gfx90a RECIPES=rocm-canary DRIVER=local
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
# hipcc would pick an installed nvcc without it.
export HIP_PLATFORM := amd
# Debian packages the real builds and tests use: the HIP compiler, podman and a Docker engine for
# containers, a container registry on loopback for the `lock pin` tests, Redis for the shared
# compiler cache tests, musl-gcc for the loader tests, and unzip to check ZIP64 archives.
SYSTEM_PACKAGES := hipcc podman runc debootstrap docker-registry docker.io redis-server musl-tools unzip

FORCE:

.PHONY: FORCE venv system-deps lint test wheels ci-matrix publish demo bench lock-check clean

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

$(BIN)/rocwheels: pyproject.toml $(VENV)/.python-id
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $@

venv: $(BIN)/rocwheels

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing Debian packages:$$missing - run: sudo apt-get install -y$$missing"; exit 1; fi; \
	  echo "installing$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

# The rules and their strictness are in pyproject.toml ([tool.ruff], [tool.mypy]).
lint: venv
	$(BIN)/ruff check pipeline
	$(BIN)/ruff format --check pipeline
	$(BIN)/mypy pipeline

test: lint system-deps
	$(BIN)/python -m pytest -q

lock-check: venv
	$(BIN)/rocwheels lock check

wheels: venv
	$(BIN)/rocwheels wheels --arch '$(ARCH)' --driver '$(DRIVER)' $(if $(RECIPES),--recipes '$(RECIPES)') $(if $(ROCM),--rocm '$(ROCM)') \
	  $(if $(PYTHON_VERSION),--python '$(PYTHON_VERSION)') $(if $(FROM_INDEX),--from-index '$(FROM_INDEX)') $(if $(NO_PIN),--no-pin)

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

# Both benchmarks run; the worse exit status is make's.
bench: venv system-deps
	$(BIN)/python benchmarks/rebuild.py; rebuild=$$?; $(BIN)/python benchmarks/run.py; repair=$$?; exit $$(( rebuild > repair ? rebuild : repair ))

clean:
	rm -rf build
	find wheelhouse -mindepth 1 ! -name .gitkeep -exec rm -rf {} +
