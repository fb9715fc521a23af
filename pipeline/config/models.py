"""Shared base for the TOML-backed models, and the one place TOML turns into them.

Models are frozen pydantic models that reject unknown keys; a validation failure becomes a
:class:`~pipeline.errors.ConfigError` naming the file and the dotted field.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from pipeline.errors import ConfigError

M = TypeVar("M", bound=BaseModel)
_SUBFIELD = re.compile(r"^(\w[\w.+\[\]-]*): (.+)$", re.DOTALL)
# A name that becomes part of a path rocwheels writes (a line's constraints file, a recipe's work
# folder): one plain component, so no value can point outside the project.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")


def plain_name(value: str, what: str) -> str:
    """``value`` if it is one plain file name (no separator, no ``..``, not absolute); else ValueError."""
    if not _PLAIN_NAME.fullmatch(value) or ".." in value:
        raise ValueError(
            f"{what} {value!r} must be a plain name: letters, digits and . _ + - (no '/', no '..', not absolute)"
        )
    return value


class Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(
            path,
            "",
            "file not found",
            fix="run rocwheels in the project folder, or point --recipes-dir (ROCWHEELS_RECIPES) at its recipes",
        ) from None
    except IsADirectoryError:
        raise ConfigError(
            path, "", "is a folder, not a TOML file", fix=f"remove or rename the folder {path.name}"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            path, "", f"not UTF-8 text (byte {exc.start}: {exc.reason})", fix="save the file as UTF-8"
        ) from None
    except OSError as exc:
        raise ConfigError(path, "", f"cannot be read: {exc.strerror}", fix="check the file's permissions") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(path, "", f"not valid TOML: {exc}", fix="fix the TOML syntax at the line shown") from None


def validate(model: type[M], data: dict[str, Any], path: Path) -> M:
    """Build ``model`` from ``data``; report the first problem with file and field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            parent = _model_at(model, error["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else "see the documentation"
            raise ConfigError(path, field, "unknown key", fix=f"remove it or use one of: {allowed}") from None
        if error["type"] == "missing":
            raise ConfigError(path, field, "required key is missing", fix=f"add {field!r}") from None
        message = error["msg"]
        if error["type"] != "value_error":
            message += f" (got {error['input']!r})"
        else:
            # Our validators may start their message with the sub-field they are about.
            message = message.removeprefix("Value error, ")
            sub = _SUBFIELD.match(message)
            if sub:
                field = ".".join(filter(None, [field, sub.group(1)]))
                message = sub.group(2)
        raise ConfigError(
            path, field, message, fix=f"correct {field or 'the file'}; recipes/README.md describes every key"
        ) from None


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The nested model class a validation location points into (for listing its keys)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = field.annotation
        args = getattr(current, "__args__", ())
        nested = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if nested:
            current = nested[0]
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None
