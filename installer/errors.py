"""Expected failures. Library code raises these; only cli.py turns them into exit codes."""

from __future__ import annotations

# Exit codes (documented in README.md).
EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_PREFLIGHT = 3
EXIT_HOST_FAILURES = 4
EXIT_UNREACHABLE = 5
EXIT_VALIDATION = 6
EXIT_CLUSTER = 7
EXIT_ENVIRONMENT = 8
EXIT_CANCELLED = 130


class GpuInstallError(Exception):
    """An expected failure with a message for the user and, ideally, a hint on how to fix it."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:  # pragma: no cover - trivial
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(GpuInstallError):
    """Bad input: site file, inventory, flags. Exit code 2."""

    exit_code = EXIT_USAGE


class PreflightError(GpuInstallError):
    exit_code = EXIT_PREFLIGHT


class HostFailures(GpuInstallError):
    exit_code = EXIT_HOST_FAILURES


class HostsUnreachable(GpuInstallError):
    exit_code = EXIT_UNREACHABLE


class ClusterUnreachable(HostsUnreachable):
    """The Kubernetes API server cannot be reached (connection refused, DNS, TLS handshake). Exit code 5."""


class ValidationFindings(GpuInstallError):
    exit_code = EXIT_VALIDATION


class ClusterError(GpuInstallError):
    """helm failed or timed out, or the Kubernetes API answered a request with an error. Exit code 7."""

    exit_code = EXIT_CLUSTER


class EnvironmentProblem(GpuInstallError):
    """Something missing on the machine running gpu-install (a binary, root, a kernel feature). Exit code 8."""

    exit_code = EXIT_ENVIRONMENT
