"""Ed25519 signatures on provenance records: who may vouch that a wheel on the index is an exact build.

Anyone who can upload to the team's index can write a record (its fingerprint is computable), so
a record is believed only when it carries a signature by a key the lock trusts
(``recipes/lock.toml`` ``[signing] public_keys``). The private key lives in CI secrets and reaches
``rocwheels wheels`` as ``ROCWHEELS_SIGNING_KEY`` (the key text) or ``ROCWHEELS_SIGNING_KEY_FILE``
(a file holding it); ``rocwheels key new`` makes a pair. Keys are written as one line of text
(``ed25519:<base64>`` public, ``ed25519-secret:<base64>`` private) so they fit a CI variable and
a TOML string. Signatures come from ``cryptography``, not from code of our own.
"""

from __future__ import annotations

import base64
import binascii
import enum
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.errors import InputError

# Imported where keys are made or read: cryptography's bindings are the largest import of
# `rocwheels inspect`, which never signs.
if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PUBLIC_PREFIX = "ed25519:"
SECRET_PREFIX = "ed25519-secret:"
KEY_ENV = "ROCWHEELS_SIGNING_KEY"
KEY_FILE_ENV = "ROCWHEELS_SIGNING_KEY_FILE"
# Signed bytes start with this, so a record signature can never be replayed as anything else.
_DOMAIN = b"rocwheels provenance record v1\n"


def parse_public_key(text: str) -> Ed25519PublicKey:
    """``ed25519:<base64 of 32 bytes>`` as a key; ValueError naming the expected form otherwise."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    raw = _decode(text, PUBLIC_PREFIX)
    if raw is None or len(raw) != 32:
        raise ValueError(
            f"{text!r} is not a public key: write ed25519:<base64 of 32 bytes>, as rocwheels key new prints"
        )
    return Ed25519PublicKey.from_public_bytes(raw)


def public_text(key: Ed25519PublicKey) -> str:
    return PUBLIC_PREFIX + base64.b64encode(key.public_bytes_raw()).decode()


@dataclass(frozen=True)
class SigningKey:
    """A private key and the text of its public key (what the lock lists and a record names)."""

    private: Ed25519PrivateKey = field(repr=False)
    public: str

    def sign(self, content: bytes) -> dict[str, str]:
        """The ``signature`` field of a record whose signed content is ``content``."""
        value = self.private.sign(_DOMAIN + content)
        return {"key": self.public, "value": base64.b64encode(value).decode()}


def new_key(path: Path) -> SigningKey:
    """Write a new private key to ``path`` (readable by its owner only; never over an existing file)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    secret = SECRET_PREFIX + base64.b64encode(key.private_bytes_raw()).decode() + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise InputError(
            f"{path} already exists: a signing key is never overwritten",
            fix="choose another --out file, or remove the old key on purpose after rotating it out of the lock",
        ) from None
    with os.fdopen(descriptor, "w", encoding="ascii") as stream:
        stream.write(secret)
    return SigningKey(key, public_text(key.public_key()))


def signing_key_from_env() -> SigningKey | None:
    """The key CI gives rocwheels (``ROCWHEELS_SIGNING_KEY`` or ``ROCWHEELS_SIGNING_KEY_FILE``), None without one."""
    text, where = os.environ.get(KEY_ENV, "").strip(), KEY_ENV
    if not text and os.environ.get(KEY_FILE_ENV):
        path = Path(os.environ[KEY_FILE_ENV])
        where = f"{KEY_FILE_ENV} ({path})"
        try:
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(
                f"{where} cannot be read: {getattr(exc, 'strerror', None) or exc}",
                fix=f"point {KEY_FILE_ENV} at the file rocwheels key new wrote",
            ) from None
    if not text:
        return None
    raw = _decode(text, SECRET_PREFIX)
    if raw is None or len(raw) != 32:
        # Never quote the value: it may be a secret pasted into the wrong variable.
        raise InputError(
            f"{where} does not hold a signing key (ed25519-secret:<base64 of 32 bytes>)",
            fix="put there the one line rocwheels key new wrote to its key file",
        )
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(raw)
    return SigningKey(key, public_text(key.public_key()))


def signing_key(recipes_dir: Path) -> SigningKey | None:
    """The key to sign this run's records with, checked against the lock before anything is built.

    A key the lock does not list would sign records that every reader refuses: said now, not
    after hours of building.
    """
    from pipeline.config.lock import trusted_keys
    from pipeline.config.recipes import LOCK_FILE

    key = signing_key_from_env()
    if key is not None and key.public not in (trusted_keys(recipes_dir) or ()):
        raise InputError(
            f"the signing key in the environment ({key.public}) is not in {recipes_dir / LOCK_FILE} "
            "[signing] public_keys: every record it signs would be refused",
            fix=f'add "{key.public}" to [signing] public_keys, or set {KEY_ENV} to a key listed there',
        )
    return key


class Trust(enum.Enum):
    SIGNED = "signed by a key the lock trusts"
    UNSIGNED = "not signed"
    UNKNOWN_KEY = "signed by a key the lock does not list"
    FORGED = "its signature does not match its content"


@dataclass(frozen=True)
class SignatureCheck:
    trust: Trust
    key: str | None = None  # the public key the record names, when it names one

    @property
    def message(self) -> str:
        return f"{self.trust.value} ({self.key})" if self.key else self.trust.value


def check_signature(content: bytes, signature: Mapping[str, str] | None, trusted: tuple[str, ...]) -> SignatureCheck:
    """How far a record whose signed content is ``content`` can be believed.

    The signature is checked against the key it names even when that key is not trusted: a
    mismatch means the record was changed after signing (or forged), whoever signed it.
    """
    from cryptography.exceptions import InvalidSignature

    if not signature:
        return SignatureCheck(Trust.UNSIGNED)
    key_text = signature.get("key") if isinstance(signature, Mapping) else None
    value = _decode(str(signature.get("value", "")), "") if isinstance(signature, Mapping) else None
    try:
        key = parse_public_key(str(key_text))
    except ValueError:
        return SignatureCheck(Trust.FORGED, str(key_text) if key_text else None)
    try:
        key.verify(value or b"", _DOMAIN + content)
    except InvalidSignature:
        return SignatureCheck(Trust.FORGED, str(key_text))
    return SignatureCheck(Trust.SIGNED if key_text in trusted else Trust.UNKNOWN_KEY, str(key_text))


def _decode(text: str, prefix: str) -> bytes | None:
    if not text.startswith(prefix):
        return None
    try:
        return base64.b64decode(text[len(prefix) :], validate=True)
    except (binascii.Error, ValueError):
        return None
