#!/usr/bin/env bash
# Make a Debian base image holding Debian's own HIP toolchain, without any container registry:
# debootstrap a root file system and import it as a single-layer image. Tests build the
# rocwheels builder on top of it, and so can users who cannot pull the ROCm images.
#
#   make-base.sh SUITE [IMAGE]      e.g. make-base.sh trixie
#
# SUITE is a Debian suite (bookworm: HIP 5.2, gfx90a/gfx940 only; trixie: HIP 5.7, also gfx942;
# sid: HIP 6.4 with hipcc 7 and clang 21, also gfx950 and compressed offload bundles - sid moves,
# so what it holds depends on the day it was made: ~1.2 GB).
# IMAGE defaults to localhost/rocwheels-test-base:SUITE and is left alone when it already exists.
# Needs root (debootstrap) and ~1 GB in $TMPDIR. Environment: ROCWHEELS_ENGINE (podman or
# docker, default podman), DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail

suite=${1:?usage: make-base.sh SUITE [IMAGE]}
image=${2:-localhost/rocwheels-test-base:$suite}
engine=${ROCWHEELS_ENGINE:-podman}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
here=$(cd "$(dirname "$0")" && pwd)

if [ "$engine" = podman ]; then
    # The same runtime settings rocwheels uses (pipeline/build/engine.py), unless the caller chose others.
    export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/../podman/containers.conf}
    if [ "$(id -u)" = 0 ]; then
        export CONTAINERS_STORAGE_CONF=${CONTAINERS_STORAGE_CONF:-$here/../podman/storage.conf}
    fi
fi

if "$engine" image inspect "$image" >/dev/null 2>&1; then
    echo "make-base: $image already exists"
    exit 0
fi

# Everything the builder Dockerfile would otherwise fetch with apt-get, so that building the
# builder on this base needs no Debian mirror: compilers, headers, venv support for the
# /opt/python layout, and ca-certificates for update-ca-certificates.
# ROCWHEELS_BASE_PACKAGES replaces the list (a Python-only base: a machine with no ROCm at all).
packages=${ROCWHEELS_BASE_PACKAGES:-python3,python3-venv,python3-dev,hipcc,gcc,g++,libc6-dev,make,cmake,ninja-build,ccache,ca-certificates}

root=$(mktemp -d "${TMPDIR:-/var/tmp}/rocwheels-base-$suite.XXXXXX")
trap 'rm -rf "$root"' EXIT

echo "make-base: debootstrap $suite into $root"
debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror"
# Package caches and lists are a few hundred MB the image does not need; the builder runs
# apt-get update itself if it ever has to install something.
chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/*

echo "make-base: importing as $image"
tar -C "$root" -c . | "$engine" import --change 'CMD ["/bin/bash"]' - "$image"
