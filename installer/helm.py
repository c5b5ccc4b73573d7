"""The only module that drives Helm (through pyhelm3 and the sha256-verified helm binary)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from installer.errors import GpuInstallError


def client(kubeconfig: Path | None = None):
    from pyhelm3 import Client

    from installer.tools import ensure_helm

    return Client(executable=str(ensure_helm()), kubeconfig=kubeconfig)


def template(chart_ref: str | Path, values: dict[str, Any], release_name: str = "gpu-operator",
             namespace: str = "gpu-operator") -> list[dict[str, Any]]:
    """`helm template` a chart (directory, .tgz or OCI ref) with values; returns the resources."""

    async def run() -> list[dict[str, Any]]:
        c = client()
        chart = await c.get_chart(chart_ref)
        return list(await c.template_resources(chart, release_name, values, namespace=namespace))

    try:
        return asyncio.run(run())
    except Exception as exc:  # pyhelm3 raises its own error types carrying helm's stderr
        if isinstance(exc, GpuInstallError):
            raise
        raise GpuInstallError(f"helm template {chart_ref} failed: {exc}",
                              hint="check the chart reference and the rendered values") from exc
