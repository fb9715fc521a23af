"""Build the rocwheels builder image (``docker/Dockerfile.builder``), tagged by its inputs.

The tag is ``localhost/rocwheels-builder:<line>-<hash>``, the hash covering every file of the
build context (the Dockerfile, its provisioning script, the rocwheels source copied in, the host
CA certificates, cibuildwheel's pins) and the build arguments. An image whose inputs have not
changed is therefore found by its tag and reused; any change gives a new tag and a build.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from pipeline.build.engine import Engine
from pipeline.config.toolchain import ROCM_PATH
from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run

log = logging.getLogger("rocwheels")

BUILDER_REPOSITORY = "localhost/rocwheels-builder"
LOCAL_PREFIX = "localhost/"
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Extra CAs of the host: pip in the container needs them behind a TLS-intercepting proxy.
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")

_TAG_PREFIX = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}")
_PYTHON_VERSION = re.compile(r"3\.\d{1,2}")
_HASH_LENGTH = 12


def build_image(
    line_name: str,
    base_image: str,
    python_versions: Sequence[str],
    engine: Engine,
    *,
    rocm_path: str = ROCM_PATH,
    rocm_archs: Sequence[str] = ("gfx90a", "gfx942"),
    rocm_wheels: Sequence[str] = (),
    rocm_wheels_index_url: str = "",
    log_file: Path | None = None,
    project_root: Path = PROJECT_ROOT,
) -> str:
    """Build (or reuse) the builder image for one ROCm line on ``base_image``; return its tag.

    ``line_name`` is the ROCm release the image is for (the tag's prefix, e.g. ``7.1``);
    ``python_versions`` are ``X.Y`` strings laid out as ``/opt/python/cpXY-cpXY``;
    ``rocm_path`` is the ROCm prefix in the base, empty for a distribution's own ROCm packages
    in ``/usr`` (Debian's clang then finds its device libraries itself). ``rocm_wheels`` (pip
    requirements, from ``rocm_wheels_index_url``) install ROCm from AMD's packages instead, linked
    at ``rocm_path``.
    """
    if not _TAG_PREFIX.fullmatch(line_name):
        raise RocwheelsError(
            f"ROCm line {line_name!r} cannot start an image tag",
            fix="use letters, digits, '.', '_' and '-' only, e.g. '7.1'",
        )
    bad = [v for v in python_versions if not _PYTHON_VERSION.fullmatch(v)]
    if bad or not python_versions:
        raise RocwheelsError(
            f"Python versions for the builder image must be X.Y strings, got {list(python_versions)}",
            fix="list them like ['3.12', '3.13']",
        )
    build_args = {
        "BASE_IMAGE": base_image,
        "ROCM_PATH": rocm_path,
        "PYTORCH_ROCM_ARCH": ";".join(rocm_archs),
        "PYTHON_VERSIONS": " ".join(python_versions),
        **(
            {"ROCM_WHEELS": " ".join(rocm_wheels), "ROCM_WHEELS_INDEX_URL": rocm_wheels_index_url}
            if rocm_wheels
            else {}
        ),
    }
    with tempfile.TemporaryDirectory(prefix="rocwheels-image-") as tmp:
        context = Path(tmp)
        _stage_context(context, project_root, python_versions)
        # A base named by tag (such as the debootstrapped test base) can be re-made or move: its
        # local image ID, when known, joins the hash. A digest already pins the content.
        base_id = "" if "@sha256:" in base_image else image_id(engine, base_image) or ""
        if not base_id and base_image.startswith(LOCAL_PREFIX):
            # The engine would try a registry named "localhost" and fail after retries.
            raise RocwheelsError(
                f"base image {base_image} is not in {engine.name}'s image storage (localhost/ images are made here, never pulled)",
                fix="make it first: `rocwheels image base --suite SUITE` for the Debian bases (see image_source in recipes/lock.toml)",
            )
        tag = f"{BUILDER_REPOSITORY}:{line_name}-{_input_hash(context, build_args, base_id)}"
        if image_id(engine, tag) is not None:
            log.info("builder image %s is up to date", tag)
            return tag
        arg_flags = [flag for key, value in build_args.items() for flag in ("--build-arg", f"{key}={value}")]
        # The ROCm packages' index may be a mirror on this host's loopback (a private index).
        network = ["--network=host"] if rocm_wheels else []
        run(
            engine.command("build", "--file", context / "Dockerfile", *arg_flags, *network, "--tag", tag, context),
            env=engine.env,
            log_file=log_file,
        )
    return tag


def image_id(engine: Engine, ref: str) -> str | None:
    """The ID of a locally stored image, or None when there is none under ``ref``."""
    # `image inspect` rather than podman's `image exists`: docker has only the former.
    result = run(engine.command("image", "inspect", "--format", "{{.Id}}", ref), env=engine.env, check=False)
    return result.output.strip() if result.returncode == 0 else None


def _stage_context(context: Path, project_root: Path, python_versions: Sequence[str]) -> None:
    """Lay out the build context the Dockerfile expects (see its header)."""
    docker_dir = project_root / "docker"
    if not (docker_dir / "Dockerfile.builder").is_file():
        raise RocwheelsError(
            f"{docker_dir / 'Dockerfile.builder'} not found: builder images are built from a rocwheels source checkout",
            fix="run rocwheels from a clone of its repository (pip install -e .)",
        )
    shutil.copy2(docker_dir / "Dockerfile.builder", context / "Dockerfile")
    shutil.copytree(docker_dir / "builder", context / "builder")

    source = context / "rocwheels"
    source.mkdir()
    shutil.copy2(project_root / "pyproject.toml", source)
    # pyproject.toml names the README as the package description.
    if (project_root / "README.md").is_file():
        shutil.copy2(project_root / "README.md", source)
    shutil.copytree(
        project_root / "pipeline", source / "pipeline", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )

    cas = context / "ca-certificates"
    cas.mkdir()
    for cert in sorted(HOST_CA_DIR.rglob("*.crt")) if HOST_CA_DIR.is_dir() else []:
        shutil.copy2(cert, cas / cert.name)

    pins = context / "constraints"
    pins.mkdir()
    cibw_resources = resources.files("cibuildwheel") / "resources"
    for version in python_versions:
        name = f"constraints-python{version.replace('.', '')}.txt"
        pin_file = cibw_resources / name
        if not pin_file.is_file():
            raise RocwheelsError(
                f"the installed cibuildwheel has no pins for Python {version} ({name})",
                fix="upgrade cibuildwheel, or drop that Python version from the line",
            )
        (pins / name).write_bytes(pin_file.read_bytes())


def _input_hash(context: Path, build_args: dict[str, str], base_id: str) -> str:
    digest = hashlib.sha256(f"base {base_id}\n".encode())
    for key in sorted(build_args):
        digest.update(f"arg {key}={build_args[key]}\n".encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        data = path.read_bytes()
        digest.update(f"file {path.relative_to(context).as_posix()} {len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()[:_HASH_LENGTH]
