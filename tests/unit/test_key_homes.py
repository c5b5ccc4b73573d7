"""The key homes (installer/signing.py private_home, gnupg_home, load_or_create): the bundle key's (Ed25519), the
evidence key's (ECDSA P-256) and the site's GnuPG home for the package repositories. A home is used only when it is
the current user's alone: created 0700 when missing; an existing one that is a symlink, belongs to another user or is
open to group or others is refused with its mode left as it was, and so is a key file of another user's or one of
the other algorithm. Homes and files of another user are made with a real chown to `nobody` (65534), so those cases
need root; the GnuPG cases run the real gpg."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from installer import signing
from installer.errors import ConfigError
from installer.evidence import sign as evidence_sign
from installer.mirror import packages

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user (nobody) needs root")
HOMES = [pytest.param(signing.ED25519, id="bundle"), pytest.param(signing.ECDSA_P256, id="evidence")]


def _load(home: Path, algorithm: str) -> signing.SigningKey:
    return signing.load_or_create(home, algorithm)


def _pem(key: object) -> bytes:
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())  # type: ignore[attr-defined]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ------------------------------------------------------------------ bundle and evidence key homes


@pytest.mark.parametrize("algorithm", HOMES)
def test_a_missing_home_is_created_0700_with_its_parents(tmp_path, algorithm):
    home = tmp_path / "state" / "gpu-install" / "keys"
    old = os.umask(0)  # the mode comes from the code, not from a strict umask
    try:
        key = _load(home, algorithm)
    finally:
        os.umask(old)
    assert key.created and _mode(home) == 0o700 and _mode(home / signing.PRIVATE) == 0o600
    assert _load(home, algorithm).fingerprint == key.fingerprint  # the home it made is one it accepts


@as_root
@pytest.mark.parametrize("algorithm", HOMES)
def test_a_home_of_another_user_is_refused(tmp_path, algorithm):
    home = tmp_path / "planted"
    home.mkdir(mode=0o700)
    os.chown(home, NOBODY, NOBODY)  # another local user made the directory the operator's key will live in
    with pytest.raises(ConfigError, match=rf"{home}: the signing key's directory belongs to another user \(owner uid "
                                          rf"{NOBODY}\b.*mode 0700\), not to you \(uid 0") as e:
        _load(home, algorithm)
    assert "a directory of your own" in str(e.value.hint)
    assert list(home.iterdir()) == [] and os.lstat(home).st_uid == NOBODY  # no key made there, nothing changed


@as_root
@pytest.mark.parametrize("algorithm", HOMES)
def test_a_home_of_another_user_with_their_key_in_it_is_refused(tmp_path, algorithm):
    """The attack itself: the other user's key, already in place, would be the key the operator is told to pin."""
    home = tmp_path / "planted"
    theirs = signing.load_or_create(home, algorithm)
    for p in (home, home / signing.PRIVATE, home / signing.PUBLIC):
        os.chown(p, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="belongs to another user"):
        _load(home, algorithm)
    assert (home / signing.PUBLIC).read_bytes() == theirs.public_path.read_bytes()


@pytest.mark.parametrize("algorithm", HOMES)
def test_a_symlinked_home_is_refused_and_not_followed(tmp_path, algorithm):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    home = tmp_path / "home"
    home.symlink_to(target)
    with pytest.raises(ConfigError, match=rf"{home}: the signing key's directory is a symbolic link \(to {target}\)"):
        _load(home, algorithm)
    assert list(target.iterdir()) == []


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o755, 0o705])
@pytest.mark.parametrize("algorithm", HOMES)
def test_an_open_home_is_refused_never_chmod_ed(tmp_path, algorithm, mode):
    home = tmp_path / "home"
    home.mkdir()
    os.chmod(home, mode)
    with pytest.raises(ConfigError, match=rf"{home}: the signing key's directory is open to group or others "
                                          rf"\(owner uid 0\b.*, mode {mode:04o}\)") as e:
        _load(home, algorithm)
    assert f"chmod 700 {home}" in str(e.value.hint)
    assert _mode(home) == mode and list(home.iterdir()) == []  # refused as it is: no chmod, no key made


@pytest.mark.parametrize("algorithm", HOMES)
def test_an_open_home_with_a_key_in_it_is_refused_too(tmp_path, algorithm):
    """Made private only by its owner: a key in a directory others could write may be one they put there."""
    home = tmp_path / "home"
    _load(home, algorithm)
    os.chmod(home, 0o777)
    with pytest.raises(ConfigError, match="someone else could have put a key there"):
        _load(home, algorithm)
    assert _mode(home) == 0o777
    os.chmod(home, 0o700)  # the fix the hint gives
    assert not _load(home, algorithm).created


@as_root
@pytest.mark.parametrize("algorithm", HOMES)
def test_a_key_file_of_another_user_is_refused(tmp_path, algorithm):
    home = tmp_path / "home"
    _load(home, algorithm)
    private = home / signing.PRIVATE
    os.chown(private, NOBODY, NOBODY)  # mode 0600 still: only its owner differs
    with pytest.raises(ConfigError, match=rf"{private}: the signing key belongs to another user \(uid {NOBODY}\b"):
        _load(home, algorithm)


def test_a_home_that_is_a_file_is_refused(tmp_path):
    home = tmp_path / "home"
    home.write_text("x")
    os.chmod(home, 0o600)
    with pytest.raises(ConfigError, match=rf"{home}: the signing key's directory is not a directory"):
        _load(home, signing.ED25519)


def test_the_evidence_home_is_held_to_the_same_rules(tmp_path, monkeypatch):
    home = tmp_path / "evidence"
    home.mkdir()
    os.chmod(home, 0o755)
    monkeypatch.setenv(evidence_sign.KEY_ENV, str(home))
    with pytest.raises(ConfigError, match=rf"{home}: the signing key's directory is open to group or others") as e:
        evidence_sign.load_key(None)
    assert evidence_sign.KEY_ENV in str(e.value.hint) and _mode(home) == 0o755


# ------------------------------------------------------------------ a key of the other algorithm


@pytest.mark.parametrize("algorithm, planted, kind", [
    (signing.ED25519, ec.generate_private_key(ec.SECP256R1()), "ECDSA secp256r1"),
    (signing.ECDSA_P256, ed25519.Ed25519PrivateKey.generate(), "Ed25519PrivateKey"),
    (signing.ECDSA_P256, ec.generate_private_key(ec.SECP384R1()), "ECDSA secp384r1"),
], ids=["ecdsa-in-bundle-home", "ed25519-in-evidence-home", "p384-in-evidence-home"])
def test_a_key_of_another_algorithm_than_the_homes_is_refused(tmp_path, algorithm, planted, kind):
    home = tmp_path / "home"
    _load(home, algorithm)
    private = home / signing.PRIVATE
    private.write_bytes(_pem(planted))  # still 0600, still the user's own: only its algorithm is wrong
    with pytest.raises(ConfigError, match=rf"{private}: not an {signing.ALGORITHMS[algorithm]} key \({kind}\)"):
        _load(home, algorithm)


# ------------------------------------------------------------------ the site's GnuPG home


@pytest.fixture(scope="module")
def gnupg_made(tmp_path_factory) -> Path:
    """A GnuPG home with the site key, made once by the real gpg through site_key (copied for each case)."""
    if not shutil.which("gpg"):
        pytest.skip("gpg missing (scripts/apt-packages.txt)")
    home = tmp_path_factory.mktemp("gnupg") / "signing"
    packages.site_key(home)
    return home


def _gnupg_copy(gnupg_made: Path, tmp_path: Path) -> Path:
    home = tmp_path / "signing"
    shutil.copytree(gnupg_made, home, symlinks=True, ignore=shutil.ignore_patterns("S.*"))  # not the agent's sockets
    os.chmod(home, 0o700)
    return home


def test_a_missing_gnupg_home_is_created_0700_and_its_key_files_pass(gnupg_made, tmp_path):
    assert _mode(gnupg_made) == 0o700
    assert (gnupg_made / "pubring.kbx").is_file() and (gnupg_made / "private-keys-v1.d").is_dir()
    home = _gnupg_copy(gnupg_made, tmp_path)
    fpr, public = packages.site_key(home)  # the copied key is found, not made again
    assert fpr == packages.site_key(gnupg_made)[0] and "BEGIN PGP PUBLIC KEY BLOCK" in public


@as_root
def test_a_gnupg_home_of_another_user_is_refused(gnupg_made, tmp_path):
    home = _gnupg_copy(gnupg_made, tmp_path)
    os.chown(home, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=rf"{home}: the GnuPG home belongs to another user \(owner uid {NOBODY}\b"):
        packages.site_key(home)
    empty = tmp_path / "planted"
    empty.mkdir(mode=0o700)
    os.chown(empty, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match="belongs to another user") as e:
        packages.site_key(empty)
    assert "--signing-home" in str(e.value.hint) and list(empty.iterdir()) == []  # no key generated there


def test_a_symlinked_gnupg_home_is_refused(gnupg_made, tmp_path):
    home = tmp_path / "link"
    home.symlink_to(gnupg_made)
    with pytest.raises(ConfigError, match=rf"{home}: the GnuPG home is a symbolic link \(to {gnupg_made}\)"):
        packages.site_key(home)


@pytest.mark.parametrize("mode", [0o777, 0o755])
def test_an_open_gnupg_home_is_refused_never_chmod_ed(gnupg_made, tmp_path, mode):
    home = _gnupg_copy(gnupg_made, tmp_path)
    os.chmod(home, mode)
    with pytest.raises(ConfigError, match=rf"{home}: the GnuPG home is open to group or others \(.*mode {mode:04o}\)"):
        packages.site_key(home)
    assert _mode(home) == mode


@as_root
@pytest.mark.parametrize("name", ["pubring.kbx", "private-keys-v1.d", "trustdb.gpg", "private-keys-v1.d/*.key"])
def test_gnupg_key_files_of_another_user_are_refused(gnupg_made, tmp_path, name):
    home = _gnupg_copy(gnupg_made, tmp_path)
    path = next(home.glob(name))
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=rf"{path}: .* belongs to another user \(owner uid {NOBODY}\b"):
        packages.site_key(home)


@pytest.mark.parametrize("name, mode", [("pubring.kbx", 0o666), ("private-keys-v1.d", 0o755),
                                        ("private-keys-v1.d/*.key", 0o640), ("trustdb.gpg", 0o620)])
def test_gnupg_key_files_open_to_others_are_refused(gnupg_made, tmp_path, name, mode):
    """The secret keys open to no one else; the public keyrings writable by no one else (gpg itself makes
    pubring.kbx 0644 under umask 022, which stays accepted)."""
    home = _gnupg_copy(gnupg_made, tmp_path)
    path = next(home.glob(name))
    os.chmod(path, mode)
    with pytest.raises(ConfigError, match=rf"{path}: .* is open to group or others \(.*mode {mode:04o}\)"):
        packages.site_key(home)
    assert _mode(path) == mode
    os.chmod(path, 0o644 if name == "pubring.kbx" else (0o700 if path.is_dir() else 0o600))
    packages.site_key(home)


def test_a_gnupg_key_file_that_is_a_symlink_is_refused(gnupg_made, tmp_path):
    home = _gnupg_copy(gnupg_made, tmp_path)
    elsewhere = tmp_path / "their-keyring.kbx"
    shutil.move(home / "pubring.kbx", elsewhere)
    (home / "pubring.kbx").symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=rf"{home / 'pubring.kbx'}: GnuPG's pubring.kbx is a symbolic link"):
        packages.site_key(home)
