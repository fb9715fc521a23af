"""Signed provenance: only a record signed by a key of the lock is believed.

Through the real command line (``pipeline.cli.main``): ``rocwheels key new``, ``verify`` of a
wheel whose record was forged, signed by a key the lock does not list, or whose wheel changed
after signing, and the key ``wheels`` signs with checked against the lock before anything is built.
Reuse from an index is tested with a real build in tests/test_ci.py.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from pipeline.errors import InputError
from pipeline.verify.provenance import Provenance, record_path, write_record
from pipeline.verify.signing import KEY_ENV, KEY_FILE_ENV, new_key, signing_key, signing_key_from_env
from tests.helpers.signing import rocwheels, signed_project
from tests.helpers.wheels import write_wheel

# The entry point binds rocwheels' log to each run's stderr (tests/helpers/signing.py).
pytestmark = pytest.mark.usefixtures("fresh_rocwheels_log")


@pytest.fixture
def team(tmp_path: Path):
    """(recipes folder trusting the team key, the team key, another key nobody listed)."""
    key = new_key(tmp_path / "keys" / "team.key")
    stranger = new_key(tmp_path / "keys" / "stranger.key")
    return signed_project(tmp_path, [key.public]), key, stranger


def _signed_wheel(folder: Path, key) -> Path:
    wheel = write_wheel(folder, "alpha", "1.0+rocm9.9")
    write_record(wheel, "f" * 64, {"recipe": {"name": "alpha"}}, {"driver": "local"}, key)
    return wheel


def test_key_new_writes_a_private_key_for_its_owner_and_prints_the_public_key(tmp_path, capsys):
    code, output = rocwheels(capsys, "key", "new", "--out", str(tmp_path / "ci.key"))
    assert code == 0, output
    secret = (tmp_path / "ci.key").read_text().strip()
    assert stat.S_IMODE((tmp_path / "ci.key").stat().st_mode) == 0o600
    public = next(line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("public key: "))
    assert public.startswith("ed25519:") and secret.startswith("ed25519-secret:") and secret not in output
    assert "[signing] public_keys" in output and KEY_ENV in output

    code, output = rocwheels(capsys, "key", "new", "--out", str(tmp_path / "ci.key"))
    assert code == 2 and "never overwritten" in output and "Traceback" not in output
    assert (tmp_path / "ci.key").read_text().strip() == secret


def test_the_key_comes_from_the_environment_or_a_file_and_a_bad_one_is_named_not_shown(tmp_path, monkeypatch):
    key = new_key(tmp_path / "ci.key")
    monkeypatch.delenv(KEY_ENV, raising=False)
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "ci.key"))
    from_file = signing_key_from_env()
    assert from_file is not None and from_file.public == key.public
    monkeypatch.setenv(KEY_ENV, (tmp_path / "ci.key").read_text())
    from_env = signing_key_from_env()
    assert from_env is not None and from_env.public == key.public
    monkeypatch.setenv(KEY_ENV, "ed25519-secret:not-base64-at-all-but-secret")
    with pytest.raises(InputError) as failure:
        signing_key_from_env()
    assert KEY_ENV in str(failure.value) and "not-base64" not in str(failure.value)


def test_a_key_the_lock_does_not_list_is_refused_before_anything_is_built(team, monkeypatch):
    recipes, key, _ = team
    monkeypatch.setenv(KEY_ENV, (recipes.parent / "keys" / "stranger.key").read_text())
    with pytest.raises(InputError, match=r"is not in .*lock.toml \[signing\] public_keys"):
        signing_key(recipes)
    monkeypatch.setenv(KEY_ENV, (recipes.parent / "keys" / "team.key").read_text())
    team_key = signing_key(recipes)
    assert team_key is not None and team_key.public == key.public


def test_a_record_signed_by_the_team_key_is_believed(team, tmp_path, capsys):
    recipes, key, _ = team
    wheel = _signed_wheel(tmp_path / "wheelhouse", key)
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "verify", "--no-smoke", str(wheel))
    assert code == 0, output
    assert "signed by a key the lock trusts" in output


def test_a_forged_record_fails_verify(team, tmp_path, capsys):
    """Someone who can upload edits a signed record (here: its fingerprint, to pass it off as another build)."""
    recipes, key, _ = team
    wheel = _signed_wheel(tmp_path / "wheelhouse", key)
    fields = json.loads(record_path(wheel).read_text())
    fields["fingerprint"] = "0" * 64
    record_path(wheel).write_text(json.dumps(fields))
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "verify", "--no-smoke", str(wheel))
    assert code == 1 and "its signature does not match its content" in output and "Traceback" not in output


def test_a_record_signed_by_an_unknown_key_fails_verify(team, tmp_path, capsys):
    recipes, _, stranger = team
    wheel = _signed_wheel(tmp_path / "wheelhouse", stranger)
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "verify", "--no-smoke", str(wheel))
    assert code == 1 and "signed by a key the lock does not list" in output and stranger.public in output


def test_a_wheel_changed_after_signing_fails_verify(team, tmp_path, capsys):
    recipes, key, _ = team
    wheel = _signed_wheel(tmp_path / "wheelhouse", key)
    write_wheel(tmp_path / "other", "alpha", "1.0+rocm9.9", build="swapped").replace(wheel)
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "verify", "--no-smoke", str(wheel))
    assert code == 1 and "differs from the provenance record's" in output


def test_an_unsigned_record_is_a_warning_where_the_lock_expects_signatures(team, tmp_path, capsys):
    recipes, _, _ = team
    wheel = write_wheel(tmp_path / "wheelhouse", "alpha", "1.0+rocm9.9")
    write_record(wheel, "f" * 64, {}, {"driver": "local"})
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "verify", "--no-smoke", str(wheel))
    assert code == 0 and "is not signed" in output and "builds this wheel again" in output


def test_the_signature_covers_every_field_but_itself(team, tmp_path):
    _, key, _ = team
    wheel = _signed_wheel(tmp_path, key)
    record = Provenance.read(record_path(wheel))
    assert record.signature and record.signature["key"] == key.public
    assert b"signature" not in record.signed_content()
    for field, value in (("sha256", "0" * 64), ("size", 1), ("toolchain", {}), ("inputs", {"recipe": {}})):
        changed = Provenance(**{**record.__dict__, field: value})
        assert changed.signature_check((key.public,)).trust.name == "FORGED", field
    assert record.signature_check((key.public,)).trust.name == "SIGNED"


def test_a_signing_key_in_the_lock_must_be_a_public_key(tmp_path, capsys):
    recipes = signed_project(tmp_path, ["ed25519-secret:AAAA"])
    code, output = rocwheels(capsys, "--recipes-dir", str(recipes), "lock", "check")
    assert code == 2 and "signing.public_keys" in output and "not a public key" in output
