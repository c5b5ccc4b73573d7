"""installer.validate.cluster.wait_clusterpolicy: apply's validate stage gives the operator time to report its
ClusterPolicy ready (its operands come after helm's wait) -- and no more than that, and not at all without one."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from installer.validate import cluster


class Custom:
    """A CustomObjectsApi answering the ClusterPolicy list with the next of `answers` (the last one repeats)."""

    def __init__(self, *answers: Any) -> None:
        self.answers, self.calls = list(answers), 0

    def list_cluster_custom_object(self, group: str, version: str, plural: str) -> Any:
        assert (group, version, plural) == ("nvidia.com", "v1", "clusterpolicies")
        self.calls += 1
        answer = self.answers[min(self.calls, len(self.answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return {"items": [{"metadata": {"name": "cluster-policy"}, **({"status": {"state": answer}} if answer else {})}]}


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """time.monotonic() as a list's last value; time.sleep(s) advances it."""
    now = [1000.0]
    monkeypatch.setattr(cluster.time, "monotonic", lambda: now[-1])
    monkeypatch.setattr(cluster.time, "sleep", lambda s: now.append(now[-1] + s))
    return now


def test_waits_until_ready_and_says_so(clock: list[float]) -> None:
    said: list[str] = []
    custom = Custom(None, "notReady", "notReady", "ready")
    cluster.wait_clusterpolicy(custom, 60, said.append)
    assert custom.calls == 4 and clock[-1] - clock[0] == 6
    assert said == ["cluster: waiting up to 60s for the operator to report ClusterPolicy cluster-policy (no state yet) "
                    "ready", "cluster: ClusterPolicy ready"]


def test_ready_at_once_says_nothing(clock: list[float]) -> None:
    said: list[str] = []
    cluster.wait_clusterpolicy(Custom("ready"), 60, said.append)
    assert said == [] and len(clock) == 1


def test_gives_up_after_the_timeout(clock: list[float]) -> None:
    said: list[str] = []
    custom = Custom("notReady")
    cluster.wait_clusterpolicy(custom, 10, said.append)
    assert clock[-1] - clock[0] == 10 and custom.calls == 6
    assert said[-1] == "cluster: ClusterPolicy cluster-policy (notReady) still not ready"


def test_no_clusterpolicy_api_returns_at_once_other_errors_are_raised(clock: list[float]) -> None:
    cluster.wait_clusterpolicy(Custom(ApiException(status=404)), 60)
    assert len(clock) == 1
    with pytest.raises(ApiException):
        cluster.wait_clusterpolicy(Custom(ApiException(status=403)), 60)
