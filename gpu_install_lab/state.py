"""The lab's state file.

Every resource is recorded *before* it is created and forgotten only after it is gone, so `lab down`
can undo whatever a crashed `lab up` left behind. Processes are recorded with their identity
(gpu_install_lab.proc: pid + start time + boot id): a recycled pid never matches, so `down` never
signals a stranger.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from installer.errors import EnvironmentProblem
from installer.util import atomic_write

STATE_VERSION = 1
# Teardown order: stop processes, remove their cgroups, then unmount, then delete links, namespaces, directories.
KIND_ORDER = ("process", "cgroup", "mount", "link", "netns", "dir")


def teardown_order(resources: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Resources in the order `down` removes them: by kind, newest first within a kind."""
    indexed = list(enumerate(resources))
    indexed.sort(key=lambda ir: (KIND_ORDER.index(ir[1]["kind"]), -ir[0]))
    return [r for _, r in indexed]


class State:
    """JSON state of one lab: {"version", "settings", "nodes", "resources"}."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.data: dict[str, Any] = {"version": STATE_VERSION, "settings": {}, "nodes": {}, "resources": []}
        if self.path.exists():
            try:
                loaded = json.loads(self.path.read_text())
            except (OSError, ValueError) as exc:
                raise EnvironmentProblem(
                    f"lab state file {self.path} is unreadable: {exc}",
                    hint="inspect it; if nothing of the lab is left running, remove it",
                ) from exc
            if loaded.get("version") != STATE_VERSION:
                raise EnvironmentProblem(
                    f"lab state file {self.path} has version {loaded.get('version')}, "
                    f"this gpu-install writes {STATE_VERSION}",
                    hint="run `lab down` with the gpu-install that created the lab",
                )
            self.data.update(loaded)

    @property
    def settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = self.data["settings"]
        return settings

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        nodes: dict[str, dict[str, Any]] = self.data["nodes"]
        return nodes

    @property
    def resources(self) -> list[dict[str, Any]]:
        resources: list[dict[str, Any]] = self.data["resources"]
        return resources

    def save(self) -> None:
        atomic_write(self.path, json.dumps(self.data, indent=2, sort_keys=True) + "\n", mode=0o600)

    def find(self, kind: str, key: str) -> dict[str, Any] | None:
        for res in self.resources:
            if res["kind"] == kind and res["key"] == key:
                return res
        return None

    def record(self, kind: str, key: str, **fields: Any) -> dict[str, Any]:
        """Add (or update) a resource and write the file before the caller creates it."""
        if kind not in KIND_ORDER:
            raise ValueError(f"unknown resource kind {kind!r}")
        res = self.find(kind, key)
        if res is None:
            res = {"kind": kind, "key": key}
            self.resources.append(res)
        res.update(fields)
        self.save()
        return res

    def forget(self, kind: str, key: str) -> None:
        self.data["resources"] = [r for r in self.resources if not (r["kind"] == kind and r["key"] == key)]
        self.save()


@contextlib.contextmanager
def locked(lab_dir: Path) -> Iterator[None]:
    """One lab command at a time per lab directory."""
    lab_dir.mkdir(parents=True, exist_ok=True)
    with open(lab_dir / ".lock", "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise EnvironmentProblem(
                f"another gpu-install lab command is working on {lab_dir}",
                hint="wait for it to finish (or use another --lab-dir)",
            ) from None
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield
