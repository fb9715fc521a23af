# The rocwheels builder image: a ROCm development image plus what cibuildwheel and the
# in-container repair need. Built by pipeline/build/image.py (build_image), which stages the context:
#   Dockerfile, builder/ (docker/builder/provision.sh), rocwheels/ (pyproject.toml and
#   pipeline/ of the running checkout), ca-certificates/ (the host's extra CAs: TLS-intercepting
#   networks need them for pip), constraints/ (cibuildwheel's pins for build and virtualenv).
# The build needs PyPI (build and virtualenv for each Python, the tools venv) and the base's
# package mirror only when the base lacks a compiler, ccache or a requested Python; it does not
# run with --network none. Builds that use the image can (see cibuildwheel's create_args).
# One stage: everything installed is used at run time (compilers, pythons, the tools venv), and
# the only input not needed afterwards, the rocwheels source, is a few hundred KB.

# rocwheels always passes the lock file's pinned reference (by digest) for BASE_IMAGE. This
# default only names the intended family - a manylinux_2_28-class (EL8) ROCm development image
# - and is an unpinned, unverified tag: do not build releases from it.
ARG BASE_IMAGE=docker.io/rocm/dev-almalinux-8:latest-complete
FROM ${BASE_IMAGE}

# The ROCm prefix. Empty for a distribution's own ROCm packages in /usr (the Debian test base):
# clang looks for the device libraries under ROCM_PATH when it is set, and /usr has none.
ARG ROCM_PATH=/opt/rocm
# Targets for PyTorch-style builds; recipes may narrow them per build through CIBW_ENVIRONMENT.
ARG PYTORCH_ROCM_ARCH="gfx90a;gfx942"
# Space-separated X.Y versions to provide as /opt/python/cpXY-cpXY (cibuildwheel's layout).
ARG PYTHON_VERSIONS="3.13"
# A `wheels` line's ROCm packages (space-separated pip requirements) and their index; ROCM_PATH
# then names the link to their root that provisioning makes.
ARG ROCM_WHEELS=""
ARG ROCM_WHEELS_INDEX_URL=""

# hipcc picks nvcc when it is installed and HIP_PLATFORM is unset; the builder is AMD-only.
# The base's own PATH and LD_LIBRARY_PATH are kept (manylinux puts its gcc toolset on PATH).
ENV ROCM_PATH=${ROCM_PATH} \
    HIP_PLATFORM=amd \
    PYTORCH_ROCM_ARCH=${PYTORCH_ROCM_ARCH} \
    PATH=${ROCM_PATH:+${ROCM_PATH}/bin:${ROCM_PATH}/llvm/bin:}${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin} \
    LD_LIBRARY_PATH=${ROCM_PATH:+${ROCM_PATH}/lib${LD_LIBRARY_PATH:+:}}${LD_LIBRARY_PATH} \
    ROCM_HOME=${ROCM_WHEELS:+${ROCM_PATH}} \
    CMAKE_PREFIX_PATH=${ROCM_WHEELS:+/opt/rocm-sdk/cmake}

# Inputs arrive by COPY, never by RUN --mount=type=bind: buildah's layer cache keys on COPY'd
# content but not on bind-mounted files, so a changed script or source would reuse a stale layer.
COPY builder/provision.sh /usr/local/libexec/rocwheels-provision
COPY ca-certificates/ /usr/local/share/rocwheels/ca-certificates/
RUN sh /usr/local/libexec/rocwheels-provision ca-certificates

RUN sh /usr/local/libexec/rocwheels-provision toolchain

COPY constraints/ /usr/local/share/rocwheels/constraints/
RUN --mount=type=cache,target=/root/.cache/pip \
    PYTHON_VERSIONS="${PYTHON_VERSIONS}" sh /usr/local/libexec/rocwheels-provision pythons

RUN --mount=type=cache,target=/root/.cache/pip \
    ROCM_WHEELS="${ROCM_WHEELS}" ROCM_WHEELS_INDEX_URL="${ROCM_WHEELS_INDEX_URL}" sh /usr/local/libexec/rocwheels-provision rocm-wheels

# Last, because it changes most often: rocwheels itself, for the repair step inside the container.
COPY rocwheels/ /usr/local/src/rocwheels/
RUN --mount=type=cache,target=/root/.cache/pip \
    sh /usr/local/libexec/rocwheels-provision tools

CMD ["/bin/bash"]
