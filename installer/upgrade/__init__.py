"""gpu-install upgrade: plan (read-only) and apply, node by node (docs/upgrade.md)."""
