"""Pin a lock line's registry builder image by digest (``rocwheels lock pin``).

A tag such as ``rocm/dev-almalinux-8:6.2.4-complete`` can move; the lock must name the image's
content. This pulls the tag with the detected container engine, reads the digest the registry
serves it under, pulls it back by that digest (so the pin is proven to resolve), and writes
``name:tag@sha256:...`` into ``recipes/lock.toml`` with tomlkit, leaving comments and layout as
they were. ``image_source`` then cites the pull instead of saying ``unverified``.

The lock is rewritten only after every pull succeeded, through a temporary file renamed over it:
a failure leaves it untouched.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import tomlkit

from pipeline.build.engine import Engine, _last_line
from pipeline.build.image import LOCAL_PREFIX
from pipeline.config.lock import UNVERIFIED, Lock, load_lock, select_line
from pipeline.config.models import validate
from pipeline.errors import RocwheelsError
from pipeline.util.cmd import run
from pipeline.util.files import atomic_write

log = logging.getLogger("rocwheels")

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
# What a registry answers for a name or tag it does not have (distribution's error codes).
_MISSING = ("manifest unknown", "name unknown", "not found", "does not exist")
PIN_NOTE = "pinned by rocwheels lock pin"
# image_source keeps what it said before the first pin (where the tag came from) after this.
_EARLIER = "; before pinning: "


@dataclass(frozen=True)
class ImageRef:
    """``[registry/]path[:tag][@sha256:...]``, split the way engines read it."""

    repository: str
    tag: str | None
    digest: str | None

    @classmethod
    def parse(cls, text: str) -> ImageRef:
        name, _, digest = text.partition("@")
        repository, tag = name, None
        last = name.rsplit("/", 1)[-1]
        if ":" in last:
            repository, tag = name.rsplit(":", 1)
        return cls(repository, tag, digest or None)

    @property
    def registry(self) -> str:
        # A first component with a dot or a port is a registry host; bare names are Docker Hub's.
        first, _, rest = self.repository.partition("/")
        return first if rest and ("." in first or ":" in first or first == "localhost") else "docker.io"

    @property
    def by_tag(self) -> str:
        return f"{self.repository}:{self.tag}" if self.tag else self.repository

    def pinned(self, digest: str) -> str:
        return f"{self.by_tag}@{digest}"


@dataclass(frozen=True)
class PinResult:
    line: str
    image: str
    status: str  # "pinned", "unchanged", "already pinned", "built locally"


def pin_line(
    recipes_dir: Path, line_name: str | None, engine_factory: Callable[[], Engine], *, refresh: bool = False
) -> PinResult:
    """Pin the builder image of ``line_name`` (default: the lock's default line) in the lock.

    An image already pinned is left alone unless ``refresh`` (then its tag is pulled again).
    ``engine_factory`` is called only when something must be pulled: images rocwheels builds
    itself (``localhost/``) are pinned by the content hash in their tag and no registry has them.
    """
    lock_file = load_lock(recipes_dir)
    name, line = select_line(lock_file, line_name)
    if line.builder_image.startswith(LOCAL_PREFIX):
        return PinResult(name, line.builder_image, "built locally")
    ref = ImageRef.parse(line.builder_image)
    if ref.digest and not refresh:
        return PinResult(name, line.builder_image, "already pinned")
    if ref.digest and ref.tag is None:
        raise RocwheelsError(
            f"{lock_file.path}: lines.{name}.builder_image {line.builder_image} names no tag to pull again",
            fix=f"write it as name:tag@sha256:... to follow a tag, then run `rocwheels lock pin --rocm {name} --refresh`",
        )
    engine: Engine = engine_factory()
    digest = pulled_digest(engine, ref, lock_file.path, name)
    image = ref.pinned(digest)
    if image == line.builder_image:
        return PinResult(name, image, "unchanged")
    source = f"{PIN_NOTE} on {datetime.now(UTC).date().isoformat()} from {ref.registry} (tag {ref.by_tag})"
    earlier = _earlier_source(line.image_source)
    write_pin(lock_file.path, name, image, source + (_EARLIER + earlier if earlier else ""))
    return PinResult(name, image, "pinned")


def pulled_digest(engine: Engine, ref: ImageRef, lock_path: Path, line_name: str) -> str:
    """Pull ``ref`` by tag and return the digest the registry serves it under."""
    fix_again = f"then run `rocwheels lock pin --rocm {line_name}` again"
    result = run(engine.command("pull", ref.by_tag), env=engine.env, check=False)
    if result.returncode != 0:
        detail = _last_line(result.output)
        if any(marker in detail.lower() for marker in _MISSING):
            raise RocwheelsError(
                f"{ref.registry} has no image {ref.by_tag} ({engine.name} pull: {detail})",
                fix=f"correct builder_image in [lines.{line_name}] of {lock_path} to a name:tag that exists, {fix_again}",
            )
        raise RocwheelsError(
            f"could not pull {ref.by_tag} from {ref.registry} ({engine.name} pull: {detail})",
            fix=f"make {ref.registry} reachable (network, proxy, `{engine.name} login {ref.registry}` for a private "
            f"registry, its TLS settings in registries.conf), {fix_again}",
        )
    # An image stored before (built here, or pulled under another name) may carry digests of
    # manifests this registry never saw: the pin is the first one it serves back.
    for digest in _repo_digests(engine, ref):
        if run(engine.command("pull", ref.pinned(digest)), env=engine.env, check=False).returncode == 0:
            return digest
    raise RocwheelsError(
        f"{engine.name} pulled {ref.by_tag} but none of its recorded digests pulls back from {ref.registry}",
        fix=f"remove the local copy (`{engine.name} rmi {ref.by_tag}`), {fix_again}",
    )


def _repo_digests(engine: Engine, ref: ImageRef) -> list[str]:
    """The digests the engine recorded for the image under ``ref``'s repository, podman's
    ``.Digest`` first (the image's primary manifest: usually, not always, the one just pulled)."""

    def inspect(template: str) -> str:
        return run(
            engine.command("image", "inspect", "--format", template, ref.by_tag), env=engine.env, quiet=True
        ).output.strip()

    wanted = _short_name(ref.repository)
    digests = []
    for entry in json.loads(inspect("{{json .RepoDigests}}") or "[]"):
        repository, _, digest = entry.partition("@")
        if _short_name(repository) == wanted and _DIGEST.fullmatch(digest):
            digests.append(digest)
    if engine.name == "podman" and (own := inspect("{{.Digest}}")) in digests:
        digests.insert(0, own)
    return list(dict.fromkeys(digests))


def _short_name(repository: str) -> str:
    # Docker records Docker Hub images without "docker.io/" (and official ones without "library/").
    return repository.removeprefix("docker.io/").removeprefix("library/")


def _earlier_source(source: str) -> str:
    """What image_source said about the tag before any pin, without the unverified mark and the
    advice to run this command."""
    if source.startswith(PIN_NOTE):
        return source.partition(_EARLIER)[2]
    text = source.strip()
    if text.lower().startswith(UNVERIFIED):
        text = text[len(UNVERIFIED) :].lstrip(" :")
    return "; ".join(part for part in text.split("; ") if "rocwheels lock pin" not in part)


def write_pin(lock_path: Path, line_name: str, image: str, source: str) -> None:
    """Set builder_image and image_source of one line, keeping the rest of the file as written."""
    document = tomlkit.parse(lock_path.read_text(encoding="utf-8"))
    table = document["lines"][line_name]
    table["builder_image"] = image
    table["image_source"] = source
    text = tomlkit.dumps(document)
    # The edited lock must still be a valid lock before it replaces the old one.
    validate(Lock, tomlkit.parse(text).unwrap(), lock_path)
    with atomic_write(lock_path) as pending:
        pending.write(text.encode("utf-8"))
    log.info("%s: [lines.%s] builder_image = %s", lock_path, line_name, image)
