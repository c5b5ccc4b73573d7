"""`mirror pull` / `mirror push` for the OS packages: the distro tools resolve, this package fetches, verifies,
records and publishes.

pull (connected side): for each node OS of the mirror plan, the package ROOTS the roles install there
(installer.mirror.plan) with their whole dependency closure, resolved by the OS's own package manager against the
upstream repositories the site file lists for that OS (`mirror.packageRepositories.<os>`):
  - apt: `apt-get update` and `apt-get install --print-uris` with a private configuration (APT_CONFIG: its own
    sources, lists, empty dpkg status, trusted keys = only the keys the site file names; nothing of this machine's
    /etc/apt is read). The suite's Release signature is checked by apt with the repository's `key`; the closure is
    what a node with nothing installed needs (complete by construction, whatever the node already has). Each .deb is
    fetched and checked against the sha256 of the signed index.
  - dnf: `dnf download --url --resolve --alldeps` in an empty installroot with its own reposdir (gpgcheck on, the
    repository's `key`); each .rpm is fetched and its signature checked with rpmkeys against the OS's keys only: an
    unsigned package, or one another key signed, is refused.
The files go to BUNDLE/packages/<os>/ (dnf: the upstream keys too, under keys/); the lock's "packages" section
records each (os, name, version, arch, source URL, sha256, size), "packageSets" each OS's manager, roots and
sources. A re-run fetches only what the bundle does not hold with the right sha256 (kill -9 safe: a file is
fetched to a .part name and renamed).

push --repo-dir DIR (air-gapped side): every package file of the lock is checked by sha256 before anything is
written; then each OS gets a SIGNED repository under DIR/packages/<os>/ -- apt: pool/ + dists/gpu-install/ (Packages
by apt-ftparchive, Release signed as InRelease and Release.gpg); dnf: the .rpm files + repodata/ (createrepo_c) with
repodata/repomd.xml.asc, and the upstream keys as RPM-GPG-KEYS-upstream.asc (the packages keep their upstream
signatures). The signing key is the site's: generated once on first push (RSA 3072, sign only) in the signing home
(default <state dir>/signing, 0700; `--signing-home`), kept there, and exported to DIR/gpu-install-site.asc: the key
`packages.key` names for apply, which trusts it on the nodes (roles/package_repo) -- no trusted=yes, no gpgcheck=0.

The work is split by concern: resolve (pull: resolve, fetch, check rpm signatures, record), publish (push: verify
the bundle's files, sign, publish), check (the served repository, as the nodes read it) and tools (the distro tools
and the names they share). This package names what the CLI and the other modules call.
"""

from installer.mirror.common import PackageFailures as PackageFailures
from installer.mirror.packages.check import _gpgv as _gpgv
from installer.mirror.packages.check import check_repo as check_repo
from installer.mirror.packages.check import repo_index as repo_index
from installer.mirror.packages.publish import _sign as _sign
from installer.mirror.packages.publish import publish as publish
from installer.mirror.packages.publish import require_base as require_base
from installer.mirror.packages.publish import signing_home as signing_home
from installer.mirror.packages.publish import site_key as site_key
from installer.mirror.packages.publish import stage as stage
from installer.mirror.packages.resolve import _apt_conf as _apt_conf
from installer.mirror.packages.resolve import check_sources as check_sources
from installer.mirror.packages.resolve import pull as pull
from installer.mirror.packages.resolve import record_skipped as record_skipped
from installer.mirror.packages.tools import BASE as BASE
from installer.mirror.packages.tools import PACKAGES as PACKAGES
from installer.mirror.packages.tools import SETS as SETS
from installer.mirror.packages.tools import SITE_KEY as SITE_KEY
from installer.mirror.packages.tools import SUITE as SUITE
from installer.mirror.packages.tools import UPSTREAM_KEYS as UPSTREAM_KEYS
