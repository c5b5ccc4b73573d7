"""The monitoring stage's entry points as apply, uninstall and the operator stage called them before
installer.features: installer.features.monitoring now. Kept until installer.pipeline runs the features' stages itself
(installer.features.staged())."""

from __future__ import annotations

from installer.features.monitoring import (
    configmaps_before_operator,
    describe,
    enabled,
    install,
    metrics_csv,
    resolve_scrape,
    uninstall,
)

__all__ = ["configmaps_before_operator", "describe", "enabled", "install", "metrics_csv", "resolve_scrape",
           "uninstall"]
