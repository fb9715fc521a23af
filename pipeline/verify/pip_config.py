"""pip's configuration on this machine, and the uv options that install what pip would with it.

The smoke test installs as ``pip install`` does here: with the indexes, find-links and constraints
of pip's configuration files and ``PIP_*`` variables. uv reads none of them, so they are read
here, where pip documents them (https://pip.pypa.io/en/stable/topics/configuration/), and handed
to uv as options. A setting with no uv equivalent sends the install back to pip.
"""

from __future__ import annotations

import configparser
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pipeline.util.cmd import uv_binary

# pip's settings (option names, as its files and PIP_* variables spell them) and uv's equivalents.
_LISTS = {  # whitespace-separated lists
    "find-links": "--find-links",
    "extra-index-url": "--extra-index-url",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
_VALUES = {"index-url": "--index-url"}
_FLAGS = {"no-index": ("--no-index",), "pre": ("--prerelease", "allow")}
# Read by uv from its environment; pip's cert is the one CA bundle it trusts, as SSL_CERT_FILE is uv's.
_ENVIRONMENT = {"cert": "SSL_CERT_FILE", "timeout": "UV_HTTP_TIMEOUT", "default-timeout": "UV_HTTP_TIMEOUT"}
# Settings that change nothing installed into a fresh venv: output, pip's own checks and cache.
_NO_EFFECT = frozenset(
    {
        "config-file",
        "disable-pip-version-check",
        "no-input",
        "quiet",
        "verbose",
        "progress-bar",
        "no-color",
        "cache-dir",
        "no-cache-dir",
        "root-user-action",
        "require-virtualenv",
        "break-system-packages",
        "no-python-version-warning",
    }
)
_TRUE = frozenset({"y", "yes", "t", "true", "on", "1"})
_FALSE = frozenset({"n", "no", "f", "false", "off", "0"})


@dataclass(frozen=True)
class UvInstall:
    """uv, and what makes ``uv pip install`` resolve and install as pip does here."""

    binary: str
    options: tuple[str, ...]
    # Its environment: pip's settings uv reads from there, and every UV_* variable unset (None),
    # so only pip's configuration decides.
    env: Mapping[str, str | None]


def pip_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """What ``pip install`` reads as its settings (option name -> value), in pip's order: the
    ``[global]`` then ``[install]`` sections of its files (global, user, then ``PIP_CONFIG_FILE``;
    none when that is ``os.devnull``), then ``PIP_*`` variables, each overriding the one before.
    The venv pip installs into is new, so it has no ``pip.conf`` of its own."""
    config_file = environ.get("PIP_CONFIG_FILE")
    files: list[Path] = []
    if config_file != os.devnull:
        xdg_dirs = environ.get("XDG_CONFIG_DIRS") or "/etc/xdg"
        files += [Path(folder, "pip", "pip.conf").expanduser() for folder in xdg_dirs.split(os.pathsep)]
        files.append(Path("/etc/pip.conf"))
        if not (config_file and os.path.exists(config_file)):
            home = Path(environ.get("HOME") or Path.home())
            files.append(home / ".pip" / "pip.conf")
            files.append(Path(environ.get("XDG_CONFIG_HOME") or home / ".config", "pip", "pip.conf"))
        if config_file:
            files.append(Path(config_file))
    sections: dict[str, dict[str, str]] = {"global": {}, "install": {}}
    for file in files:
        parser = configparser.RawConfigParser()
        parser.read(file, encoding="utf-8")
        for section, settings in sections.items():
            if parser.has_section(section):
                settings.update((_name(key), value) for key, value in parser.items(section))
    variables = {
        _name(key[4:]): value
        for key, value in environ.items()
        if key.startswith("PIP_") and key[4:].lower() not in ("version", "help")
    }
    # An empty value is no setting: the one before it stays.
    layers = (sections["global"], sections["install"], variables)
    return {key: value for layer in layers for key, value in layer.items() if value}


def uv_install(environ: Mapping[str, str]) -> UvInstall | str:
    """uv set up to install as pip would with this machine's settings, or why it cannot be."""
    try:
        settings = pip_settings(environ)
    except (configparser.Error, UnicodeDecodeError) as exc:
        return f"pip's configuration does not parse ({str(exc).splitlines()[0]})"
    return uv_for_pip_settings(settings, environ)


def uv_for_pip_settings(settings: Mapping[str, str], environ: Mapping[str, str]) -> UvInstall | str:
    """uv with options for pip's ``settings``, or why uv cannot install as pip would."""
    options = ["--index-strategy", "unsafe-best-match"]  # pip takes the best version of every index
    env: dict[str, str | None] = {key: None for key in environ if key.startswith("UV_")}
    for key, value in settings.items():
        if key in _LISTS:
            options += [part for item in value.split() for part in (_LISTS[key], item)]
        elif key in _VALUES:
            options += [_VALUES[key], value]
        elif key in _FLAGS:
            if value.lower() not in _TRUE | _FALSE:
                return f"pip setting {key}={value} is not a yes or no"
            options += _FLAGS[key] if value.lower() in _TRUE else ()
        elif key in _ENVIRONMENT:
            env[_ENVIRONMENT[key]] = value
        elif key not in _NO_EFFECT:
            return f"pip setting {key} has no uv equivalent here"
    binary = uv_binary()
    if binary is None:
        return "uv is not installed"
    return UvInstall(binary, tuple(options), env)


def _name(key: str) -> str:
    """pip's spelling of a setting: lower case, dashes, no leading ``--``."""
    return key.lower().replace("_", "-").removeprefix("--")
