"""Fetch a recipe's source into a clean folder: a folder of this repo, a checked sdist, or a git commit."""

from __future__ import annotations

import http.client
import shutil
import tarfile
import tempfile
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from pipeline.config.layout import cache_dir
from pipeline.config.recipes import Recipe, recipe_path
from pipeline.errors import ConfigError, RocwheelsError
from pipeline.util.cmd import run
from pipeline.util.files import atomic_write, file_sha256
from pipeline.util.log import RecipeLogger

# Build products a source folder of this repo may hold from a manual build; never copied.
IGNORED_NAMES = ("build", "dist", "__pycache__", ".git")
_IGNORED = shutil.ignore_patterns(*IGNORED_NAMES, "*.egg-info")


def prepare_source(recipe: Recipe, recipes_dir: Path, dest: Path, *, log_file: Path, logger: RecipeLogger) -> Path:
    """Lay the recipe's source out in ``dest`` (emptied first); return the folder to build."""
    if dest.exists():
        shutil.rmtree(dest)
    source = recipe.source
    if source.path:
        shutil.copytree(recipes_dir / source.path, dest, ignore=_IGNORED)
    elif source.url:
        archive = _download(
            source.url,
            source.sha256 or "",
            recipe_path(recipes_dir, recipe.name),
            f"versions.{recipe.version}.source.sha256",
            logger,
        )
        _unpack(archive, dest)
    else:
        dest.mkdir(parents=True)
        git = ["git", "-C", str(dest)]
        run([*git, "init", "-q"], log_file=log_file, logger=logger)
        run(
            [*git, "fetch", "-q", "--depth", "1", source.git or "", source.commit or ""],
            log_file=log_file,
            logger=logger,
        )
        run([*git, "checkout", "-q", "FETCH_HEAD"], log_file=log_file, logger=logger)
        if source.submodules:
            run(
                [*git, "submodule", "update", "-q", "--init", "--recursive", "--depth", "1"],
                log_file=log_file,
                logger=logger,
            )
    # Patches are made against the top of the source (``git diff`` style, -p1), before any subdir.
    for patch in recipe.patches:
        run(
            ["git", "apply", "-p1", "--whitespace=nowarn", recipes_dir / patch],
            cwd=dest,
            log_file=log_file,
            logger=logger,
        )
    root = dest / source.subdir if source.subdir else dest
    # The recipe's subdir is a plain relative path; a link inside the source must not lead out either.
    if not root.is_dir() or not root.resolve().is_relative_to(dest.resolve()):
        raise ConfigError(
            recipe_path(recipes_dir, recipe.name),
            f"versions.{recipe.version}.source.subdir",
            f"{source.subdir!r} is not a folder inside the source",
        )
    return root


def fetch_build_wheels(recipe: Recipe, recipes_dir: Path, logger: RecipeLogger) -> list[Path]:
    """The recipe's build wheels, downloaded once into the cache and hash-checked, under their own file names."""
    return [
        _download(
            wheel.url,
            wheel.sha256,
            recipe_path(recipes_dir, recipe.name),
            f"build.wheels[{index}].sha256",
            logger,
            target=cache_dir() / "wheels" / wheel.sha256 / wheel.filename,
        )
        for index, wheel in enumerate(recipe.build.wheels)
    ]


def _download(
    url: str, sha256: str, recipe_file: Path, field: str, logger: RecipeLogger, *, target: Path | None = None
) -> Path:
    """Download once into the cache, keyed by the expected hash; a mismatch deletes the file.

    The download is written under a temporary name and renamed only once its hash matches; an
    error or an interruption removes it, so the cache holds complete, checked files only.
    """
    target = target or cache_dir() / "sources" / f"{sha256}-{Path(urllib.parse.urlsplit(url).path).name}"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading %s", url)
    # 0o600: the cache's downloads stay private to their user, as they always were.
    with atomic_write(target, mode=0o600) as partial:
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                shutil.copyfileobj(response, partial)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise RocwheelsError(
                f"cannot download {url}: {exc}", fix="check the URL and the network, or place the file in the cache"
            ) from None
        digest = file_sha256(partial)
        if digest != sha256:
            raise ConfigError(
                recipe_file,
                field,
                f"{url} has sha256 {digest}, the recipe expects {sha256}",
                fix=f"if the new file is trusted, update {field}; otherwise the download was tampered with or the URL changed",
            )
    return target


def _unpack(archive: Path, dest: Path) -> None:
    """Unpack an sdist; a single top-level folder (the usual ``name-version/``) becomes ``dest``."""
    staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=".unpack-"))
    try:
        try:
            if zipfile.is_zipfile(archive):
                with zipfile.ZipFile(archive) as zipped:
                    zipped.extractall(staging)
            else:
                with tarfile.open(archive) as tarred:
                    tarred.extractall(staging, filter="data")
        except tarfile.FilterError as exc:  # a member or link that leads out of the folder, a device file
            raise RocwheelsError(
                f"{archive}: unsafe member: {exc}; nothing of it was built",
                fix="do not build from this archive; check that the recipe's url and sha256 name the project's real release",
            ) from None
        except (tarfile.TarError, zipfile.BadZipFile) as exc:
            raise RocwheelsError(
                f"{archive}: not a readable source archive ({exc})",
                fix="check the recipe's url: it must name a .tar.gz, .tar.bz2, .tar.xz or .zip source archive",
            ) from None
        entries = list(staging.iterdir())
        top = entries[0] if len(entries) == 1 and entries[0].is_dir() else staging
        shutil.move(top, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
