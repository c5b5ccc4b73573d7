"""The bastion's package repository, served over HTTP on the bastion's lab address only.

  repo/apt/  pool/*.deb + dists/lab/main/binary-amd64/{Packages,Release} (apt-ftparchive)
  repo/rpm/  *.rpm + repodata/ (createrepo_c)
  repo/files/  plain files, the site's file mirror (e.g. NVIDIA .run driver installers for driver.mode runfile),
             served as http://<bastion>:8080/files/<name>

`lab up` always adds one STAND-IN package per format, built here (dpkg-deb, rpmbuild), so the tests
have something real to install: gpu-install-lab-standin (it installs a text file, nothing else).
Put more packages into the pools with `gpu-install lab repo-add FILE...` (e.g. .debs from
`apt-get download`); every `lab up` re-indexes.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from gpu_install_lab.sh import run
from installer.errors import ConfigError

STANDIN = "gpu-install-lab-standin"
STANDIN_VERSION = "1.0"
SUITE = "lab"
PORT = 8080
_README = (
    "gpu-install lab STAND-IN package: built by `gpu-install lab up` so integration tests have a\n"
    "real package to install from the lab repository. It contains only this file.\n"
)


def _build_deb(pool: Path) -> Path:
    out = pool / f"{STANDIN}_{STANDIN_VERSION}_all.deb"
    if out.exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "DEBIAN").mkdir()
        (root / "DEBIAN" / "control").write_text(
            f"Package: {STANDIN}\nVersion: {STANDIN_VERSION}\nArchitecture: all\n"
            "Maintainer: gpu-install lab <lab@gpu-install.invalid>\nSection: misc\nPriority: optional\n"
            "Description: gpu-install lab stand-in package\n Installs one text file; for lab tests only.\n"
        )
        doc = root / "usr" / "share" / STANDIN
        doc.mkdir(parents=True)
        (doc / "README").write_text(_README)
        run(["dpkg-deb", "--root-owner-group", "--build", root, out])
    return out


def _build_rpm(rpm_dir: Path) -> Path:
    out = rpm_dir / f"{STANDIN}-{STANDIN_VERSION}-1.noarch.rpm"
    if out.exists():
        return out
    spec = f"""\
Name: {STANDIN}
Version: {STANDIN_VERSION}
Release: 1
Summary: gpu-install lab stand-in package
License: Apache-2.0
BuildArch: noarch
%description
Installs one text file; for lab tests only.
%install
mkdir -p %{{buildroot}}/usr/share/{STANDIN}
cat > %{{buildroot}}/usr/share/{STANDIN}/README <<'EOF'
{_README}EOF
%files
/usr/share/{STANDIN}/README
"""
    with tempfile.TemporaryDirectory() as tmp:
        top = Path(tmp)
        (top / "standin.spec").write_text(spec)
        run(["rpmbuild", "-bb", "--quiet", "--define", f"_topdir {top}", "--define", "_build_id_links none",
             top / "standin.spec"])
        built = next((top / "RPMS" / "noarch").glob("*.rpm"))
        shutil.copy2(built, out)
    return out


def add_packages(repo: Path, files: list[Path]) -> list[Path]:
    """Copy .deb/.rpm files into the pools (indexed by the next `refresh`), .run files into files/."""
    placed = []
    for f in files:
        if f.suffix == ".deb":
            dest = repo / "apt" / "pool" / "main" / f.name
        elif f.suffix == ".rpm":
            dest = repo / "rpm" / f.name
        elif f.suffix == ".run":
            dest = repo / "files" / f.name
        else:
            raise ConfigError(f"{f}: not a .deb, .rpm or .run",
                              hint="the lab repository serves apt and RPM packages, and .run files under /files/")
        if not f.is_file():
            raise ConfigError(f"{f}: no such file")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dest)
        placed.append(dest)
    return placed


def refresh(repo: Path) -> None:
    """Build the stand-ins (once) and (re)generate the apt and RPM metadata."""
    apt, rpm = repo / "apt", repo / "rpm"
    pool = apt / "pool" / "main"
    pool.mkdir(parents=True, exist_ok=True)
    rpm.mkdir(parents=True, exist_ok=True)
    (repo / "files").mkdir(exist_ok=True)
    _build_deb(pool)
    _build_rpm(rpm)
    dist = apt / "dists" / SUITE
    binary = dist / "main" / "binary-amd64"
    binary.mkdir(parents=True, exist_ok=True)
    packages = run(["apt-ftparchive", "packages", "pool"], cwd=apt).stdout
    (binary / "Packages").write_text(packages)
    release = run(
        ["apt-ftparchive",
         "-o", f"APT::FTPArchive::Release::Suite={SUITE}", "-o", f"APT::FTPArchive::Release::Codename={SUITE}",
         "-o", "APT::FTPArchive::Release::Components=main", "-o", "APT::FTPArchive::Release::Architectures=amd64 all",
         "-o", "APT::FTPArchive::Release::Origin=gpu-install-lab", "release", dist],
    ).stdout
    (dist / "Release").write_text(release)
    run(["createrepo_c", "--quiet", "--update", rpm])


def apt_source(url: str) -> str:
    # Unsigned: the lab repo is trusted by transport (only reachable inside the lab). See docs/lab.md.
    return f"deb [trusted=yes] {url}/apt {SUITE} main\n"


def yum_repo(url: str) -> str:
    return (
        "[gpu-install-lab]\nname=gpu-install lab repository\n"
        f"baseurl={url}/rpm\nenabled=1\ngpgcheck=0\nrepo_gpgcheck=0\nmetadata_expire=0\n"
    )
