"""The site model (site.yaml): one typed, validated description of a GPU site.

Layering: model defaults → site file → `--set path=value` flags. Errors name the field path and
the fix and are raised as ConfigError (exit code 2).

Beside it: installer.config_base (what the blocks are built from), installer.config_features (the features' blocks),
installer.patterns (the field vocabulary and its checks), installer.safefile (reading the file),
installer/data/sample-site.yaml (`gpu-install config sample`).
"""

from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from installer.config_base import Block, ImageOverride, VersionText, rules
from installer.config_features import GpuManager, Hami, Monitoring, Nos
from installer.errors import ConfigError
from installer.patterns import (
    APT_SUITE,
    CHART_REPOSITORY,
    DEFAULT_CHART_REPOSITORY,
    DNS_LABEL,
    DURATION,
    ENV_NAME,
    EXTENDED_RESOURCE,
    KUBERNETES_VERSION,
    MIG_CONFIG_NAME,
    MIG_PROFILE,
    OS_TAG,
    PACKAGE_URL,
    PATH_COMPONENT,
    PATTERN_TEXT,
    REGISTRY_HOST,
    SECRET_NAME,
    TAG,
    UPSTREAM_MIRROR,
    URL_PREFIX,
    chart_repository,
    dns_label,
    no_userinfo,
    package_url,
    registry_host,
    strip_userinfo,
    upstream_mirror,
)
from installer.safefile import read_yaml


def _feature_rules(block: BaseModel) -> None:
    """The features' own rules on a block that selects them (mig.dynamic, sharing.mode): each feature in
    installer.features checks its mode's settings (Feature.check_block), raising ValueError that pydantic reports at
    the block's path. Imported when a site is validated: the features import this model."""
    from installer import features

    features.check_block(block)


class Operator(Block):
    model_config = ConfigDict(json_schema_extra={"allOf": [  # _sha256_of_a_chart_file()
        {"if": {"required": ["chartSha256"], "properties": {"chartSha256": {"type": "string"}}},
         "then": {"required": ["chart"], "properties": {"chart": {"type": "string", "not": {"pattern": "://"}}}}},
    ]})

    version: VersionText = Field(description="GPU Operator release from the catalog, e.g. v24.9.2",
                                 json_schema_extra=rules(integer={"minimum": 0}))
    namespace: str = Field("gpu-operator", description="namespace the operator is installed into",
                           json_schema_extra=rules({"pattern": DNS_LABEL}))
    releaseName: str = Field("gpu-operator", description="Helm release name",
                             json_schema_extra=rules({"pattern": DNS_LABEL}))
    chart: str | None = Field(
        None, description="GPU Operator chart: directory, .tgz or oci://<registry>/<path>/gpu-operator "
        "(--chart / GPU_INSTALL_CHART override it); a relative path is relative to the site file"
    )
    chartSha256: str | None = Field(
        None, description="sha256 of the chart archive (.tgz) operator.chart names, 64 lower-case hex digits as "
        "`gpu-install mirror push` prints it: apply, operator install and upgrade install only a chart file with "
        "this digest (docs/airgap.md)", json_schema_extra=rules({"pattern": "^[0-9a-f]{64}$"})
    )

    @field_validator("namespace", "releaseName")
    @classmethod
    def _dns_label(cls, v: str) -> str:
        return dns_label(v)

    @field_validator("chart")
    @classmethod
    def _chart_without_credentials(cls, v: str | None) -> str | None:
        return v if v is None else no_userinfo(v, CHART_REGISTRY_CREDENTIALS)

    @field_validator("chartSha256")
    @classmethod
    def _chart_sha256(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-f]{64}", v):
            raise ValueError("not a sha256: give the 64 lower-case hex digits `gpu-install mirror push` prints as "
                             "operator.chartSha256 (sha256sum of the chart .tgz)")
        return v

    @model_validator(mode="after")
    def _sha256_of_a_chart_file(self) -> Operator:
        if self.chartSha256 and not self.chart:
            raise ValueError("operator.chartSha256 pins the chart archive operator.chart names: set operator.chart to "
                             "that .tgz too (`gpu-install mirror push` prints both)")
        if self.chartSha256 and self.chart and "://" in self.chart:
            raise ValueError(f"operator.chartSha256 is the sha256 of a chart archive (.tgz), and operator.chart "
                             f"{self.chart} is a reference helm pulls itself: set operator.chart to the bundle's .tgz "
                             "that `gpu-install mirror push` prints next to the sha256, or remove operator.chartSha256")
        return self


#: fields whose value may be a secret pasted by mistake: messages about them never show it
CREDENTIAL_FIELDS = {"usernameEnv", "passwordEnv", "dockerConfigFile"}

#: where each kind of URL takes its credentials instead of user:password@ (the fix a refused URL's message gives)
CHART_REGISTRY_CREDENTIALS = ("log helm in to the registry beforehand (`helm registry login REGISTRY --username USER "
                              "--password-stdin`), or give the chart .tgz `gpu-install mirror push` prints with its "
                              "sha256")
CHART_REPOSITORY_CREDENTIALS = ("give them as mirror.chartCredentials.usernameEnv/passwordEnv, the names of environment "
                                "variables holding them (helm reads them from a 0600 file, never from its command line)")
RUNFILE_CREDENTIALS = ("the nodes fetch driver.runfile without credentials: serve it in the site's file mirror without "
                       "them (driver.runfileSha256 proves what it serves), or download it where the credentials are "
                       "and give driver.runfile as a path on the controller")
PACKAGE_SOURCE_CREDENTIALS = ("give them as mirror.packageRepositories.<os>[].credentials.usernameEnv/passwordEnv, the "
                              "names of environment variables holding them (apt and dnf read them from a 0600 file, "
                              "never from their command line)")
SITE_PACKAGES_CREDENTIALS = ("the nodes read packages.url without credentials (its index is signed with the site key, "
                             "packages.key): serve `mirror push --repo-dir` DIR without them inside the site")
EXTENDER_CREDENTIALS = "kube-scheduler calls an extender without credentials in its URL (enableHTTPS for TLS)"


def holds_credential(loc: list[str] | tuple[str, ...]) -> bool:
    """A field path that is a credential field, lies inside one, or holds one (registry, registry.pullSecret: a
    value given for them may carry a pasted secret): messages never show what was given there."""
    parts = [str(p) for p in loc]
    return bool(set(parts) & CREDENTIAL_FIELDS) or parts in (["registry"], ["registry", "pullSecret"])


class EnvCredentials(Block):
    """The user and password of a source that needs a login (mirror.chartCredentials, a package repository's
    credentials), referenced by the names of the environment variables holding them, never written inline (as
    registry.pullSecret)."""

    usernameEnv: str = Field(description="name of the env var holding the user name", pattern=ENV_NAME)
    passwordEnv: str = Field(description="name of the env var holding the password/token", pattern=ENV_NAME)


class PullSecret(Block):
    """Credentials are referenced, never written inline: from env vars or a docker config file."""

    model_config = ConfigDict(json_schema_extra={"allOf": [  # _one_source()
        {"if": {"required": ["usernameEnv"], "properties": {"usernameEnv": {"type": "string"}}},
         "then": {"required": ["passwordEnv"], "properties": {"passwordEnv": {"type": "string"}}}},
        {"if": {"required": ["passwordEnv"], "properties": {"passwordEnv": {"type": "string"}}},
         "then": {"required": ["usernameEnv"], "properties": {"usernameEnv": {"type": "string"}}}},
        {"if": {"required": ["dockerConfigFile"], "properties": {"dockerConfigFile": {"type": "string"}}},
         "then": {"properties": {"usernameEnv": {"type": "null"}, "passwordEnv": {"type": "null"}}}},
    ]})

    name: str = Field(description="name of the kubernetes.io/dockerconfigjson Secret",
                      json_schema_extra=rules({"pattern": SECRET_NAME}))
    usernameEnv: str | None = Field(None, description="name of the env var holding the registry user name",
                                    pattern=ENV_NAME)
    passwordEnv: str | None = Field(None, description="name of the env var holding the registry password/token",
                                    pattern=ENV_NAME)
    dockerConfigFile: Path | None = Field(None, description="file with a docker config.json to use as-is")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", v):
            raise ValueError(f"{v!r} is not a valid Secret name (lower case letters, digits, '-', '.')")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> PullSecret:
        if self.dockerConfigFile and (self.usernameEnv or self.passwordEnv):
            raise ValueError("give either usernameEnv/passwordEnv or dockerConfigFile, not both")
        if bool(self.usernameEnv) != bool(self.passwordEnv):
            raise ValueError("usernameEnv and passwordEnv go together")
        return self


class Registry(Block):
    host: str = Field(description="private registry, host[:port], e.g. registry.example.com:5000",
                      json_schema_extra=rules({"pattern": f"^{REGISTRY_HOST}$", "maxLength": 255}))
    layout: Literal["strip-host", "keep-host"] = Field(
        "strip-host",
        description="strip-host: nvcr.io/nvidia/x → <host>/nvidia/x; keep-host: → <host>/nvcr.io/nvidia/x",
    )
    prefix: str = Field("", description="optional path prefix inside the registry, e.g. mirror/gpu",
                        json_schema_extra=rules({"pattern": rf"^/*(?:{PATH_COMPONENT}(?:/{PATH_COMPONENT})*)?/*$"}))
    pullSecret: PullSecret | None = Field(None, description="image pull Secret put on every component")
    ca: Path | None = Field(None, description="CA certificate (PEM) the nodes must trust for this registry")
    insecure: StrictBool = Field(False, description="plain HTTP / unverified TLS (labs only)")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        return registry_host(v)

    @field_validator("prefix")
    @classmethod
    def _prefix(cls, v: str) -> str:
        v = v.strip("/")
        # OCI distribution path components: [a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*, joined by '/'
        component = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
        if v and not re.fullmatch(rf"{component}(?:/{component})*", v):
            raise ValueError(f"{v!r} is not a valid repository path (lower case, digits, . _ - /)")
        return v


class SecureBoot(Block):
    mode: Literal["off", "require", "auto"] = Field(
        "off", description="off: refuse GPU nodes with Secure Boot on where a driver is built on the node or runs in a "
        "container (host, runfile, operator) · require: every GPU node must have Secure Boot on · auto: either; "
        "host/runfile modes need certificate and signingKey, and preflight checks the certificate is enrolled (MOK)")
    certificate: Path | None = Field(
        None, description="the site's MOK certificate (X.509, DER or PEM) on the controller (relative to the site "
        "file): what the nodes must have enrolled")
    signingKey: Path | None = Field(
        None, description="the certificate's private key on the controller (relative to the site file), mode 0600; "
        "never logged nor passed as a variable")


class Driver(Block):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        # _runfile(): runfile and its checksum belong to mode runfile
        {"if": {"required": ["mode"], "properties": {"mode": {"const": "runfile"}}},
         "then": {"required": ["runfile"], "properties": {"runfile": {"type": "string", "minLength": 1}}},
         "else": {"properties": {"runfile": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 0}]},
                                 "runfileSha256": {"type": "null"}}}},
        # a runfile fetched from a URL has its sha256 given (a controller path is hashed on the controller)
        {"if": {"required": ["runfile"], "properties": {"runfile": {"type": "string", "pattern": "://"}}},
         "then": {"required": ["runfileSha256"], "properties": {"runfileSha256": {"type": "string"}}}},
    ]})

    mode: Literal["host", "runfile", "operator", "precompiled", "preinstalled"] = Field(
        "operator",
        description="host: roles install packages, operator driver off · runfile: roles run NVIDIA's .run installer "
        "from the site's file mirror, operator driver off · operator: driver container · "
        "precompiled: precompiled driver container · preinstalled: already on the nodes",
    )
    version: VersionText | None = Field(
        None, description="driver version (precompiled: branch, e.g. 550); default: catalog",
        pattern=rf"^{TAG}$", json_schema_extra=rules({"pattern": rf"^{TAG}$"}, integer={"minimum": 0}))
    runfile: str | None = Field(
        None, description="runfile mode: NVIDIA-Linux-<arch>-<version>.run as an http(s) URL (the site's file mirror) "
        "or a path on the controller (relative to the site file)"
    )
    runfileSha256: str | None = Field(None, description="runfile mode: sha256 of the runfile, checked on the node "
                                      "before it runs; required when driver.runfile is a URL",
                                      json_schema_extra=rules({"pattern": "^[0-9a-fA-F]{64}$"}))
    kernelModuleType: Literal["auto", "open", "proprietary"] | None = Field(
        None, description="kernel modules flavour; default: the release's default"
    )
    rebootPolicy: Literal["never", "if-needed", "always"] = Field(
        "never", description="host/runfile mode: reboot nodes after a driver install (never: report 'reboot required')"
    )
    serial: str | StrictInt = Field(
        "100%", description="host/runfile mode: nodes per driver batch (Ansible serial), e.g. 1 or 25%",
        json_schema_extra=rules({"pattern": "^(?:(?:100|[1-9][0-9]?)%|[1-9][0-9]*)$"}, minimum=1),
    )
    customImageOs: list[Annotated[str, Field(pattern=r"^[a-z][a-z-]*\d[\w.-]{0,30}$", max_length=40)]] = Field(
        default_factory=list,
        description="operator/precompiled mode: OS tags (e.g. debian12) the site builds its own driver images for; "
        "other OSes must be ones NVIDIA publishes driver images of the release for",
        max_length=64)
    secureBoot: SecureBoot = Field(default_factory=SecureBoot,
                                   description="UEFI Secure Boot on the GPU nodes and the site's module signing key")

    @field_validator("serial")
    @classmethod
    def _serial(cls, v: str | int) -> str | int:
        if isinstance(v, int):
            if v < 1:
                raise ValueError("must be at least 1")
            return v
        if not re.fullmatch(r"(100|[1-9][0-9]?)%|[1-9][0-9]*", v):
            raise ValueError(f"{v!r} is neither a host count nor a percentage such as 25%")
        return int(v) if v.isdigit() else v

    @field_validator("runfile")
    @classmethod
    def _runfile_without_credentials(cls, v: str | None) -> str | None:
        return v if v is None else no_userinfo(v, RUNFILE_CREDENTIALS)

    @field_validator("runfileSha256")
    @classmethod
    def _sha256(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("must be 64 hex digits (sha256sum of the .run file)")
        return v.lower() if v else v

    @model_validator(mode="after")
    def _secure_boot(self) -> Driver:
        sb = self.secureBoot
        if sb.mode == "off":
            return self
        if self.mode == "operator":
            raise ValueError(f"driver.secureBoot.mode {sb.mode} with driver.mode operator: the driver container builds "
                             "the module on the node, and nothing signs it with a key the nodes trust. Use driver.mode "
                             "precompiled (modules signed by NVIDIA/Canonical, where NVIDIA publishes them), or "
                             "driver.mode host with the site key (driver.secureBoot.certificate and signingKey)")
        if self.mode in ("host", "runfile"):
            missing = [f"driver.secureBoot.{f}" for f in ("certificate", "signingKey") if getattr(sb, f) is None]
            if missing:
                raise ValueError(f"driver.secureBoot.mode {sb.mode} with driver.mode {self.mode} needs "
                                 f"{' and '.join(missing)}: the site's MOK certificate and its private key (controller "
                                 "paths) sign the module built on the node")
        return self

    @model_validator(mode="after")
    def _runfile(self) -> Driver:
        if self.mode != "runfile":
            if self.runfile or self.runfileSha256:
                raise ValueError("driver.runfile/runfileSha256 are only used with driver.mode: runfile")
            return self
        if not self.runfile:
            raise ValueError("driver.mode runfile needs driver.runfile (URL in the site's file mirror or a path)")
        if "://" in self.runfile and not self.runfileSha256:
            # the nodes fetch it and run it as root: only a checksum from the site file says it is the file meant
            # (a controller path needs none: the role hashes it on the controller and checks the node's copy)
            name = self.runfile.rsplit("/", 1)[-1] or "NVIDIA-Linux-<arch>-<version>.run"
            raise ValueError(f"driver.runfileSha256 is required with a URL driver.runfile (…/{name}): nothing "
                             "else proves what the URL serves before it runs as root on the nodes. Set it to the "
                             f"output of `sha256sum {name}` on a copy you trust (a runfile `mirror push --repo-dir "
                             "DIR` published from a verified bundle: its line in DIR/files/SHA256SUMS), or give "
                             "driver.runfile as a path on the controller")
        named = runfile_version(self.runfile)
        if self.version and named and self.version != named:
            raise ValueError(f"driver.version {self.version} but driver.runfile is the {named} installer")
        version = self.version or named  # role_vars() uses the same (no assignment here: validate_assignment)
        if not version or not re.fullmatch(r"[0-9]+\.[0-9]+(\.[0-9]+)?", version):
            raise ValueError("driver.mode runfile needs the exact driver version (e.g. 535.216.03): set driver.version "
                             "or name the file NVIDIA-Linux-<arch>-<version>.run")
        return self


def runfile_version(runfile: str) -> str | None:
    """The driver version in an NVIDIA runfile name (NVIDIA-Linux-x86_64-535.216.03.run and -STANDIN/-grid variants)."""
    m = re.match(r"NVIDIA-Linux-[A-Za-z0-9_]+-([0-9]+\.[0-9]+(?:\.[0-9]+)?)(?:[-.][^/]*)?\.run\Z", runfile.rsplit("/", 1)[-1])
    return m.group(1) if m else None


class Toolkit(Block):
    mode: Literal["host", "operator"] = Field("operator", description="host: roles install it; operator: container")
    version: VersionText | None = Field(None, description="toolkit image version (operator mode); default: catalog",
                                        pattern=rf"^{TAG}$",
                                        json_schema_extra=rules({"pattern": rf"^{TAG}$"}, integer={"minimum": 0}))


class MigDevices(Block):
    """One entry of a mig-parted config (its `version: v1` format, same keys)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    devices: Literal["all"] | list[Annotated[StrictInt, Field(ge=0, le=63)]] = Field(
        "all", description="GPU indices on the node, or all")
    device_filter: str | list[str] | None = Field(
        None, alias="device-filter", description="PCI device IDs this entry applies to, e.g. 0x233010DE")
    mig_enabled: StrictBool = Field(alias="mig-enabled", description="MIG mode on these GPUs")
    mig_devices: dict[str, Annotated[StrictInt, Field(ge=0, le=7)]] = Field(
        default_factory=dict, alias="mig-devices", description="profile (1g.10gb, 1g.10gb+me) -> instances per GPU")

    @field_validator("devices")
    @classmethod
    def _unique(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or len(set(v)) != len(v)):
            raise ValueError("a non-empty list of distinct GPU indices, or all")
        return v

    @field_validator("device_filter")
    @classmethod
    def _filter(cls, v: str | list[str] | None) -> str | list[str] | None:
        for d in [v] if isinstance(v, str) else v or []:
            if not re.fullmatch(r"0x[0-9A-Fa-f]{8}", d):
                raise ValueError(f"{d!r} is not a PCI device ID such as 0x233010DE (device << 16 | vendor 10de)")
        return v

    @field_validator("mig_devices")
    @classmethod
    def _profiles(cls, v: dict[str, int]) -> dict[str, int]:
        for name in v:
            if not re.fullmatch(MIG_PROFILE, name):
                raise ValueError(f"{name!r} is not a MIG profile such as 1g.10gb, 3g.40gb or 1g.10gb+me")
        return v

    @model_validator(mode="after")
    def _enabled(self) -> MigDevices:
        if not self.mig_enabled and any(self.mig_devices.values()):
            raise ValueError("mig-devices with mig-enabled: false: turn MIG on for these GPUs, or drop the devices")
        return self


class Mig(Block):
    strategy: Literal["none", "single", "mixed"] = Field("single", description="MIG strategy of the device plugin "
                                                         "(mixed with dynamic nos)")
    dynamic: Literal["none", "nos"] = Field(
        "none", description="none: MIG layouts are static (mig.config, mig-manager) | nos: nos partitions the GPUs of "
        "the GPU nodes on demand (MIG mode turned on by gpu-install; mig-manager off; host var gpu_install_mig_dynamic "
        "false leaves a node out)")
    nos: Nos = Field(default_factory=Nos, description="settings of mig.dynamic nos")
    config: str | None = Field(None, description="default MIG config name (nvidia.com/mig.config), e.g. all-1g.10gb")
    configMap: str | None = Field(None, description="custom mig-parted ConfigMap (key config.yaml) instead of the default")
    customConfigs: dict[str, list[MigDevices]] = Field(
        default_factory=dict, description="mig-parted configs of the site (name -> entries), shipped as the operator's "
        "MIG ConfigMap (v24.6.0+) beside all-disabled; names usable in mig.config and gpu_install_mig_config")

    @field_validator("customConfigs")
    @classmethod
    def _names(cls, v: dict[str, list[MigDevices]]) -> dict[str, list[MigDevices]]:
        for name, entries in v.items():
            if not re.fullmatch(MIG_CONFIG_NAME, name):
                raise ValueError(f"{name!r} is not a valid label value (it becomes nvidia.com/mig.config=<name>)")
            if not entries:
                raise ValueError(f"{name}: no entries (at least one {{devices, mig-enabled, mig-devices}})")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> Mig:
        if self.customConfigs and self.configMap:
            raise ValueError("customConfigs and configMap both name the MIG ConfigMap: keep one")
        return self

    @model_validator(mode="after")
    def _features(self) -> Mig:
        _feature_rules(self)
        return self


class TimeSlicing(Block):
    replicas: StrictInt = Field(0, ge=0, le=128, description="time-sliced replicas per GPU; 0 or 1 = off")
    renameByDefault: StrictBool = Field(False, description="advertise nvidia.com/gpu.shared instead of nvidia.com/gpu")


class Mps(Block):
    replicas: StrictInt = Field(0, ge=0, le=48, description="MPS clients per GPU (device plugin v0.15.0+, GPU Operator "
                                                          "v24.3.0+; at most 48); 0 or 1 = off")
    renameByDefault: StrictBool = Field(False, description="advertise nvidia.com/gpu.shared instead of nvidia.com/gpu")


class DevicePlugin(Block):
    timeSlicing: TimeSlicing = Field(default_factory=TimeSlicing)
    mps: Mps = Field(default_factory=Mps, description="share each GPU through CUDA MPS (full GPUs only, not with "
                                                      "mig.strategy mixed)")

    @model_validator(mode="after")
    def _one_sharing(self) -> DevicePlugin:
        if self.timeSlicing.replicas > 1 and self.mps.replicas > 1:
            raise ValueError("timeSlicing and mps are both on: the device plugin shares a node's GPUs one way; set one "
                             "of the replicas to 0")
        return self

    def sharing(self) -> tuple[str, int, bool]:
        """(method, replicas, renameByDefault) of the sharing in force: ("", 0, False) when none."""
        if self.mps.replicas > 1:
            return "mps", self.mps.replicas, self.mps.renameByDefault
        if self.timeSlicing.replicas > 1:
            return "timeSlicing", self.timeSlicing.replicas, self.timeSlicing.renameByDefault
        return "", 0, False


class Cdi(Block):
    enabled: StrictBool | None = Field(None, description="Container Device Interface; default: the release's default")


class SandboxWorkloads(Block):
    enabled: StrictBool = Field(False, description="VM workloads (KubeVirt/Kata): deploys and mirrors the sandbox components")


class ComponentOverride(ImageOverride):
    enabled: StrictBool | None = None


class ManagedResource(Block):
    name: str = Field(description="extended resource the extender manages, e.g. nvidia.com/gpu",
                      json_schema_extra=rules({"pattern": EXTENDED_RESOURCE}))
    ignoredByScheduler: StrictBool = Field(False, description="the scheduler skips its own fit check for it")

    @field_validator("name")
    @classmethod
    def _extended(cls, v: str) -> str:
        prefix, _, rest = v.partition("/")
        if not rest or prefix.endswith("kubernetes.io") or not re.fullmatch(
                r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+", prefix) \
                or not re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", rest):
            raise ValueError(f"{v!r} is not an extended resource name (domain/name outside kubernetes.io, "
                             "e.g. nvidia.com/gpu)")
        return v


class Extender(Block):
    """A kube-scheduler extender (the fields Kubernetes' extender config has, same names)."""

    model_config = ConfigDict(json_schema_extra={  # _weight(): prioritizeVerb needs a positive weight
        "if": {"required": ["prioritizeVerb"], "properties": {"prioritizeVerb": {"type": "string", "minLength": 1}}},
        "then": {"required": ["weight"], "properties": {"weight": {"type": "integer", "minimum": 1}}},
    })

    urlPrefix: str = Field(description="http(s) URL of the extender, e.g. http://127.0.0.1:3456/scheduler",
                           json_schema_extra=rules({"pattern": URL_PREFIX}))
    filterVerb: str | None = Field(None, description="verb appended to urlPrefix for filter calls")
    preemptVerb: str | None = Field(None, description="verb for preempt calls")
    prioritizeVerb: str | None = Field(None, description="verb for prioritize calls (needs a positive weight)")
    weight: StrictInt | None = Field(None, validate_default=True, description="multiplier of the prioritize scores; > 0 with prioritizeVerb",
                               json_schema_extra=rules(minimum=0))
    bindVerb: str | None = Field(None, description="verb for bind calls (at most one extender may bind)")
    enableHTTPS: StrictBool = Field(False, description="use TLS settings for the extender (no CA given: unverified)")
    httpTimeout: str | None = Field(None, description="timeout of a call, a duration such as 30s (default 30s)",
                                    json_schema_extra=rules({"pattern": DURATION}))
    nodeCacheCapable: StrictBool = Field(False, description="the extender caches nodes: only node names are sent")
    ignorable: StrictBool = Field(False, description="scheduling goes on when the extender fails or is unreachable")
    managedResources: list[ManagedResource] = Field(
        default_factory=list, description="extended resources for which pods are sent to this extender")

    @field_validator("urlPrefix")
    @classmethod
    def _url(cls, v: str) -> str:
        no_userinfo(v, EXTENDER_CREDENTIALS)
        if not re.fullmatch(r"https?://[^/\s?#]+(/[^\s?#]*)?", v):
            raise ValueError(f"{v!r} is not an http(s) URL such as http://127.0.0.1:3456/scheduler")
        return v

    @field_validator("weight", mode="after")
    @classmethod
    def _weight(cls, v: int | None, info: Any) -> int | None:
        if info.data.get("prioritizeVerb") and (v is None or v <= 0):
            raise ValueError("must be a positive integer when prioritizeVerb is set "
                             "(kube-scheduler rejects the configuration otherwise)")
        if v is not None and v < 0:
            raise ValueError("must not be negative")
        return v

    @field_validator("httpTimeout")
    @classmethod
    def _duration(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"([0-9]+(\.[0-9]+)?(ns|us|ms|s|m|h))+", v):
            raise ValueError(f"{v!r} is not a duration such as 30s, 1m30s or 500ms")
        return v

    @field_validator("managedResources")
    @classmethod
    def _unique(cls, v: list[ManagedResource]) -> list[ManagedResource]:
        names = [r.name for r in v]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate managed resource {', '.join(dup)}")
        return v


def kubernetes_minor(version: str) -> tuple[int, int]:
    """(major, minor) of a Kubernetes version such as v1.20.2, 1.23 or v1.29.0-rc.1."""
    from packaging.version import Version

    release = Version(version.split("-")[0].split("+")[0]).release
    return release[0], (release[1] if len(release) > 1 else 0)


class Scheduler(Block):
    extenders: list[Extender] = Field(
        default_factory=list, description="kube-scheduler extenders (scheduler_policy role); empty: role does nothing",
        json_schema_extra=rules(  # _one_binder(): at most one extender binds
            contains={"required": ["bindVerb"], "properties": {"bindVerb": {"type": "string", "minLength": 1}}},
            minContains=0, maxContains=1))
    format: Literal["auto", "policy", "config"] = Field(
        "auto", description="auto: legacy Policy below Kubernetes 1.23, KubeSchedulerConfiguration from 1.23")
    kubernetesVersion: VersionText | None = Field(
        None, description="Kubernetes version of the control plane; default: the kube-scheduler image tag",
        json_schema_extra=rules({"pattern": KUBERNETES_VERSION}))

    @field_validator("kubernetesVersion")
    @classmethod
    def _version(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+][0-9A-Za-z.-]+)?", v):
            raise ValueError(f"{v!r} is not a Kubernetes version such as v1.20.2")
        return v

    @model_validator(mode="after")
    def _one_binder(self) -> Scheduler:
        binders = [str(i) for i, e in enumerate(self.extenders) if e.bindVerb]
        if len(binders) > 1:
            raise ValueError(f"extenders: at most one extender may set bindVerb (extenders {', '.join(binders)} do)")
        v = self.kubernetesVersion
        if v and self.format == "policy" and kubernetes_minor(v) >= (1, 23):
            raise ValueError(f"format: policy is gone from Kubernetes 1.23 (kubernetesVersion {v}); use auto or config")
        return self


class Sharing(Block):
    mode: Literal["none", "gpumanager", "hami"] = Field(
        "none", description="none | gpumanager: tkestack GPUManager on every GPU node (tencent.com/vcuda-core/-memory), "
        "its extender gpu-quota-admission wired into kube-scheduler | hami: Project-HAMi (nvidia.com/gpu shared, "
        "nvidia.com/gpumem, nvidia.com/gpucores), its own scheduler")
    gpumanager: GpuManager = Field(default_factory=GpuManager, description="settings of sharing.mode gpumanager")
    hami: Hami | None = Field(None, description="settings of sharing.mode hami (kubernetesVersion required)")

    @model_validator(mode="after")
    def _features(self) -> Sharing:
        _feature_rules(self)
        return self


class PackageSource(Block):
    """An upstream package repository that `mirror pull` resolves one node OS's packages against (connected side)."""

    url: str = Field(description="repository URL: http(s)://… or file:///… (apt: the archive root holding dists/; "
                                 "dnf: the directory holding repodata/)",
                     json_schema_extra=rules({"pattern": PACKAGE_URL, "maxLength": 2048}))
    suite: str | None = Field(None, description="apt only: the suite (jammy, bookworm) or a flat repository's "
                                                "directory ending in '/' (NVIDIA's CUDA repositories: '/')",
                              json_schema_extra=rules({"pattern": APT_SUITE, "maxLength": 255}))
    components: list[str] = Field(default_factory=lambda: ["main"],
                                  description="apt only: the components of the suite (not for a flat repository)")
    key: Path = Field(description="the repository's OpenPGP public key (armored or binary): apt checks the "
                                  "suite's Release signature with it, dnf pulls refuse packages it did not sign")
    credentials: EnvCredentials | None = Field(
        None, description="the user and password `mirror pull` gives this http(s) repository when it needs them: "
        "usernameEnv/passwordEnv, the names of environment variables holding them (apt reads them from an auth.conf, "
        "dnf from the .repo file, both 0600 in a private work directory; the files are fetched with HTTP Basic "
        "authentication sent to URLs under this url only); never in the URL")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return package_url(no_userinfo(v, PACKAGE_SOURCE_CREDENTIALS))

    @model_validator(mode="after")
    def _credentials_over_http(self) -> PackageSource:
        if self.credentials is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"credentials: {self.url} is not an http(s) URL; a file:/// copy needs no login "
                             "(leave credentials out)")
        return self

    @field_validator("suite")
    @classmethod
    def _suite(cls, v: str | None) -> str | None:
        if v is not None and not re.match(APT_SUITE, v):
            raise ValueError(f"{v!r} is not an apt suite (jammy) or a flat repository directory ending in '/'")
        return v

    @field_validator("components")
    @classmethod
    def _components(cls, v: list[str]) -> list[str]:
        for c in v:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/-]*", c):
                raise ValueError(f"{c!r} is not an apt component (main, restricted, non-free)")
        return v


OS_MIRROR_CREDENTIALS = ("the driver container reads packages.osMirror without credentials: serve the mirror to "
                         "the cluster without them (the driver image checks its signatures with the OS vendor's keys)")


def os_mirror_url(v: str) -> str:
    """A packages.osMirror entry: an http(s) URL of the site's OS mirror without user:password@, query or fragment;
    no trailing '/'. ValueError worded for the site file."""
    no_userinfo(v, OS_MIRROR_CREDENTIALS)
    if len(v) > 2048 or not re.match(URL_PREFIX, v):
        raise ValueError("not an http(s) URL of an OS mirror such as http://mirror.example.com/ubuntu (apt: the archive "
                         "root holding dists/) or http://mirror.example.com/rocky/9/BaseOS/x86_64/os (dnf: the "
                         "directory holding repodata/); no query or fragment")
    return v.rstrip("/") if v.rstrip("/") not in ("http:/", "https:/") else v


def _http_url(v: str | None, credentials_fix: str, example: str) -> str | None:
    """An http(s) URL of a site field, without user:password@ (credentials_fix says where they go instead) and without
    a trailing slash; ValueError naming what was given (shortened) and an example."""
    if v is None:
        return v
    no_userinfo(v, credentials_fix)
    if len(v) > 2048 or not re.match(URL_PREFIX, v):
        shown = v if len(v) <= 80 else v[:77] + "..."
        raise ValueError(f"{shown!r} is not an http(s) URL such as {example}")
    return v.rstrip("/")


class Packages(Block):
    """The site's own package repository (air-gapped side): what `mirror push --repo-dir DIR` published, served at
    `url`; apply configures it on the GPU nodes, trusting `key`, before the roles install packages."""

    url: str | None = Field(None, description="where the nodes reach the published DIR (http(s)://host/path); the "
                                              "node's repository is <url>/packages/<gpu_install_os>; unset: the "
                                              "nodes' own repositories are used and none is added",
                            json_schema_extra=rules({"pattern": URL_PREFIX, "maxLength": 2048}))
    key: Path | None = Field(None, description="the site's public signing key as `mirror push` exported it "
                                               "(DIR/gpu-install-site.asc); required with url")
    ca: Path | None = Field(None, description="driver.mode operator: the CA certificate (PEM) of an https packages.url "
                                              "or osMirror, given to the driver container (driver.certConfig); a "
                                              "relative path is relative to the site file")
    osMirror: list[Annotated[str, AfterValidator(os_mirror_url)]] = Field(
        default_factory=list, max_length=16,
        description="driver.mode operator: the site's existing OS mirror, instead of the site repository, as the "
        "source the operator's driver container installs the node kernel's packages from at start (Ubuntu: "
        "linux-headers/-image/-modules-<kernel>; RHEL/Rocky: kernel-headers/-devel-<kernel>, kernel-<kernel>, "
        "elfutils-libelf-devel): http(s) URLs without user:password@ -- apt: an archive root holding dists/ (the "
        "suites of the nodes' release are read), dnf: a repository directory holding repodata/; checked with the OS "
        "vendor's keys the driver image holds, never trusted=yes. Set: `mirror plan/pull` carry none of those packages",
        json_schema_extra=rules(items={"type": "string", "pattern": URL_PREFIX, "maxLength": 2048}))

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return _http_url(v, SITE_PACKAGES_CREDENTIALS, "http://repo.example.com/gpu-install")

    @field_validator("osMirror")
    @classmethod
    def _os_mirror_once(cls, v: list[str]) -> list[str]:
        for i, url in enumerate(v):
            if url in v[:i]:
                raise ValueError(f"{url} is given twice (entries {v.index(url)} and {i}): remove one")
        return v

    @model_validator(mode="after")
    def _key_with_url(self) -> Packages:
        if self.url and not self.key:
            raise ValueError("url is set without key: give the site key `gpu-install mirror push` exported "
                             "(DIR/gpu-install-site.asc); the nodes check the repository's signature with it")
        return self


PROXY_CREDENTIALS = ("a proxy that needs a login cannot be given here yet: let the driver container's network "
                     "reach it without one (an allow-list for the GPU nodes), or use packages.url (the site repository)")


class Proxy(Block):
    """A proxied (not air-gapped) site's HTTP proxy: passed, where the site asks, to the operator's driver container,
    which installs the node kernel's packages from the network at start (proxy.driverContainer)."""

    http: str | None = Field(None, description="HTTP_PROXY: http(s)://host:port of the proxy for http URLs",
                             json_schema_extra=rules({"pattern": URL_PREFIX, "maxLength": 2048}))
    https: str | None = Field(None, description="HTTPS_PROXY: http(s)://host:port of the proxy for https URLs",
                              json_schema_extra=rules({"pattern": URL_PREFIX, "maxLength": 2048}))
    noProxy: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9.*:/\[\]_-]{1,253}$")]] = Field(
        default_factory=list, max_length=256,
        description="NO_PROXY: hosts, domains (.example.internal), IP addresses and CIDRs reached without the proxy "
                    "(the registry, the site repository, the cluster's service network)")
    driverContainer: bool = Field(False, description="pass HTTP_PROXY/HTTPS_PROXY/NO_PROXY (and their lowercase "
                                                     "forms) to the operator's driver container (driver.env)")

    @field_validator("http", "https")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return _http_url(v, PROXY_CREDENTIALS, "http://proxy.example.internal:3128")

    @model_validator(mode="after")
    def _something_to_pass(self) -> Proxy:
        if self.driverContainer and not (self.http or self.https):
            raise ValueError("driverContainer is true without http or https: there is no proxy to pass")
        return self


class Mirror(Block):
    """Where `gpu-install mirror` takes what the site does not have yet (on the connected side), and the bundle keys
    the air-gapped side trusts (trustedKeys)."""

    chartRepository: str = Field(
        DEFAULT_CHART_REPOSITORY,
        description="Helm chart repository the GPU Operator chart (gpu-operator at operator.version) is mirrored from: "
        "an http(s) repository URL (index.yaml) or oci://<registry>[/<path>] (the chart is <that>/gpu-operator)",
        json_schema_extra=rules({"pattern": CHART_REPOSITORY, "maxLength": 2048}))
    chartCredentials: EnvCredentials | None = Field(
        None, description="the user and password `mirror pull` gives mirror.chartRepository (http(s) or oci://) when "
        "it needs them: usernameEnv/passwordEnv, the names of environment variables holding them (helm reads them "
        "from a 0600 file in its own temporary home); never in the URL")

    upstream: dict[str, str] = Field(
        default_factory=dict,
        description="upstream registry host -> where `mirror pull` reads its images instead, registry[:port][/path] "
        "(an intermediate mirror), e.g. {nvcr.io: mirror.internal:5000}; the bundle still records the upstream name",
        json_schema_extra=rules(propertyNames={"pattern": f"^{REGISTRY_HOST}$", "maxLength": 255},
                                additionalProperties={"type": "string", "pattern": UPSTREAM_MIRROR, "maxLength": 2048}))
    upstreamCa: Path | None = Field(
        None, description="CA certificate (PEM) `mirror pull` trusts besides the system's, for the upstream registries "
        "or their mirrors")
    packageRepositories: dict[str, list[PackageSource]] = Field(
        default_factory=dict,
        description="node OS (as gpu_install_os gives it: ubuntu22.04, rocky9.4) -> the upstream apt or dnf "
        "repositories `mirror pull` resolves that OS's packages and their dependency closure against",
        json_schema_extra=rules(propertyNames={"pattern": OS_TAG, "maxLength": 64}))
    trustedKeys: list[Path] = Field(
        default_factory=list, max_length=16,
        description="air-gapped side: public keys (PEM) of the connected side's bundle signing key, as `mirror pull` "
        "exported them (<key home>/signing-key.pub.pem), carried across once and compared by fingerprint; `mirror push` "
        "and `mirror verify --bundle` accept a bundle only when its lock is signed by one of them (with --trusted-key); "
        "a relative path is relative to the site file")
    maxBundleAge: StrictInt | None = Field(
        None, ge=1, le=3650,
        description="air-gapped side: the oldest bundle, in days since `mirror pull` signed its lock, that `mirror "
        "push` and `mirror verify --bundle` accept (an older one, or one without a creation time, exit 2); unset: "
        "a bundle older than 30 days is only warned about")

    @field_validator("maxBundleAge", mode="before")
    @classmethod
    def _max_bundle_age(cls, v: Any) -> Any:
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 3650):
            raise ValueError("must be a whole number of days from 1 to 3650, such as 30 (no unit)")
        return v

    @field_validator("chartRepository")
    @classmethod
    def _chart_repository(cls, v: str) -> str:
        return chart_repository(no_userinfo(v, CHART_REPOSITORY_CREDENTIALS))

    @field_validator("packageRepositories")
    @classmethod
    def _package_repositories(cls, v: dict[str, list[PackageSource]]) -> dict[str, list[PackageSource]]:
        for os_tag, sources in v.items():
            if not re.match(OS_TAG, os_tag):
                raise ValueError(f"{os_tag!r} is not a node OS: give it as gpu_install_os does (ubuntu22.04, rocky9.4)")
            if not sources:
                raise ValueError(f"{os_tag}: no repository given")
        return v

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, v: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in v.items():
            host = registry_host(key)
            if host in out:
                raise ValueError(f"{key!r}: the registry {host} is given twice")
            out[host] = upstream_mirror(value)
        return out


class Site(Block):
    operator: Operator
    registry: Registry
    runtime: Literal["containerd", "docker"] = Field("containerd", description="container runtime on the nodes")
    driver: Driver = Field(default_factory=Driver)
    toolkit: Toolkit = Field(default_factory=Toolkit)
    mig: Mig = Field(default_factory=Mig)
    devicePlugin: DevicePlugin = Field(default_factory=DevicePlugin)
    cdi: Cdi = Field(default_factory=Cdi)
    sandboxWorkloads: SandboxWorkloads = Field(default_factory=SandboxWorkloads)
    components: dict[str, ComponentOverride] = Field(
        default_factory=dict, description="per-component overrides keyed by catalog component name"
    )
    values: dict[str, Any] = Field(
        default_factory=dict, description="extra Helm values merged last (checked against the release's keys)"
    )
    scheduler: Scheduler = Field(default_factory=Scheduler, description="kube-scheduler extenders (control plane)")
    sharing: Sharing = Field(default_factory=Sharing, description="GPU sharing by a component of its own (GPUManager)")
    mirror: Mirror = Field(default_factory=Mirror,
                           description="gpu-install mirror: where the chart and the images come from")
    monitoring: Monitoring = Field(default_factory=Monitoring, description="DCGM exporter -> Prometheus -> Grafana")
    packages: Packages = Field(default_factory=Packages,
                               description="the site's package repository the nodes install driver/toolkit "
                               "packages from (air-gapped side)")
    proxy: Proxy = Field(default_factory=Proxy, description="a proxied site's HTTP proxy (driver container)")


# ---------------------------------------------------------------- loading


def site_schema() -> dict[str, Any]:
    schema = Site.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "gpu-install site.yaml"
    return schema


def load_site(path: str | os.PathLike[str] | None, overrides: list[str] | None = None) -> Site:
    """Read and validate a site file; relative file references become relative to it. The catalog release and
    everything that depends on it are checked by installer.plan.resolve."""
    if not path:
        raise ConfigError("no site file given", hint="pass -s site.yaml (or set GPU_INSTALL_SITE)")
    data = read_yaml(Path(path), what="site file")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the site file must be a mapping, got {type(data).__name__}")
    flags = {}
    for item in overrides or []:
        path = item.split("=", 1)[0]
        # named in messages as given -- except a credential field's value, which is never shown
        flags[path] = f"{path}=…" if holds_credential(path.split(".")) else strip_userinfo(item)
        apply_set(data, item)
    site = parse_site(data, source=str(path), flags=flags)
    # file references: ~ is the user's home; a relative path is relative to the site file, not to where the command runs
    base = Path(path).resolve().parent

    def local(ref: Path) -> Path:
        ref = ref.expanduser()
        return ref if ref.is_absolute() else base / ref

    reg = site.registry
    if reg.ca:
        reg.ca = local(reg.ca)
    if site.operator.chart and "://" not in site.operator.chart:
        site.operator.chart = str(local(Path(site.operator.chart)))
    if site.driver.runfile and "://" not in site.driver.runfile:
        site.driver.runfile = str(local(Path(site.driver.runfile)))
    sb = site.driver.secureBoot
    if sb.certificate:
        sb.certificate = local(sb.certificate)
    if sb.signingKey:
        sb.signingKey = local(sb.signingKey)
    if site.mirror.upstreamCa:
        site.mirror.upstreamCa = local(site.mirror.upstreamCa)
    site.mirror.trustedKeys = [local(k) for k in site.mirror.trustedKeys]
    for sources in site.mirror.packageRepositories.values():
        for src in sources:
            src.key = local(src.key)
    if site.packages.key:
        site.packages.key = local(site.packages.key)
    if site.packages.ca:
        site.packages.ca = local(site.packages.ca)
    if site.sharing.hami and site.sharing.hami.chart and "://" not in site.sharing.hami.chart:
        site.sharing.hami.chart = str(local(Path(site.sharing.hami.chart)))
    if site.mig.nos.chart and "://" not in site.mig.nos.chart:
        site.mig.nos.chart = str(local(Path(site.mig.nos.chart)))
    if site.monitoring.metrics:
        site.monitoring.metrics = local(site.monitoring.metrics)
    if site.monitoring.files:
        site.monitoring.files = local(site.monitoring.files)
    if reg.pullSecret and reg.pullSecret.dockerConfigFile:
        reg.pullSecret.dockerConfigFile = local(reg.pullSecret.dockerConfigFile)
    return site


def apply_set(data: dict[str, Any], item: str) -> None:
    """`--set a.b.c=value` (value parsed as YAML)."""
    import yaml

    if "=" not in item:
        raise ConfigError(f"--set {item!r}: expected path=value", hint="e.g. --set registry.host=reg.local:5000")
    path, raw = item.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    node = data
    parts = path.split(".")
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if isinstance(node, list) or _is_list_field(parts[: i + 1]):  # --set names mapping keys only: a list is
            whole = ".".join(parts[: i + 1])                           # set whole (or edited in the file)
            raise ConfigError(f"--set {path}: {whole} is a list, and --set cannot address one entry of a list "
                              f"({parts[i + 1]!r} is taken as a key)",
                              hint=f"edit {whole} in the site file, or give the whole list as YAML: --set "
                                   f"'{whole}=[...]' (YAML: every entry, as the site file has them)")
        if not isinstance(node, dict):
            raise ConfigError(f"--set {path}: {'.'.join(parts[: i + 1])} is a {type(node).__name__} value, not a "
                              "mapping: it has no field " + repr(parts[i + 1]),
                              hint=f"set {'.'.join(parts[: i + 1])} itself, e.g. --set {'.'.join(parts[: i + 1])}=VALUE")
    node[parts[-1]] = value


def _is_list_field(loc: list[str]) -> bool:
    """The site schema has a list at loc (e.g. scheduler.extenders), whether or not the file sets it."""
    model = _model_at(loc[:-1]) if len(loc) > 1 else Site
    fields = getattr(model, "model_fields", None) or {}
    if loc[-1] not in fields:
        return False
    ann = fields[loc[-1]].annotation
    return getattr(ann, "__origin__", None) is list or any(
        getattr(a, "__origin__", None) is list for a in getattr(ann, "__args__", ()))


def parse_site(data: dict[str, Any], source: str = "site", flags: dict[str, str] | None = None) -> Site:
    """The typed site; errors name each field, and a field set by --set names the flag rather than the file."""
    try:
        return Site.model_validate(data)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            line = _describe(dict(err))
            dotted = ".".join(str(p) for p in err["loc"])
            flag = next((f for path, f in (flags or {}).items()
                         if dotted == path or dotted.startswith(path + ".") or path.startswith(dotted + ".")), None)
            lines.append(f"{line} (from --set {flag})" if flag else line)
        if flags and all("(from --set " in ln for ln in lines):
            source = "--set"
        raise ConfigError(
            f"{source}: {len(lines)} problem(s):\n  " + "\n  ".join(lines),
            hint="`gpu-install config sample` prints a commented example; `gpu-install config schema` the schema",
        ) from None


def _describe(err: dict[str, Any]) -> str:
    loc = [str(p) for p in err["loc"]]
    path = ".".join(loc) or "(top)"
    kind = err["type"]
    if kind == "extra_forbidden":
        parent = _model_at(loc[:-1])
        known = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(loc[-1], known, n=1)
        fix = f"did you mean '{close[0]}'?" if close else (f"known fields: {', '.join(known)}" if known else "remove it")
        return f"{path}: unknown field; {fix}"
    if kind == "missing":
        return f"{path}: required field is missing"
    got = err.get("input")
    text = strip_userinfo(repr(got))
    shown = "" if isinstance(got, (dict, list)) else f" (got {text if len(text) <= 80 else text[:77] + '...'})"
    if holds_credential(loc):
        shown = ""  # never echo what may be a password pasted into the wrong field
        if kind == "string_pattern_mismatch":
            return (f"{path}: must be the NAME of an environment variable (letters, digits, '_'), not its value: "
                    "export the credential in a variable and give the variable's name here")
    msg = err["msg"]
    if kind == "string_pattern_mismatch":
        msg = "is not " + PATTERN_TEXT.get(str((err.get("ctx") or {}).get("pattern")), f"of the form {msg}")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{path}: {msg}{shown}"


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    """The model class that the location `loc` (a list of field names / dict keys) points into."""
    model: Any = Site
    skip_key = False
    for part in loc:
        if skip_key:  # a dict key (e.g. the component name in components.<name>)
            skip_key = False
            continue
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        ann = fields[part].annotation
        args: tuple[Any, ...] = getattr(ann, "__args__", ())
        if getattr(ann, "__origin__", None) is dict:
            model, skip_key = args[1], True
            continue
        if getattr(ann, "__origin__", None) is list:  # e.g. scheduler.extenders.<index>
            model, skip_key = args[0], True
            continue
        model = next((c for c in (ann, *args) if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) and not skip_key else None


def sample_site() -> str:
    """The commented example site file (`gpu-install config sample`), shipped as installer/data/sample-site.yaml."""
    from importlib import resources

    return (resources.files("installer") / "data" / "sample-site.yaml").read_text(encoding="utf-8")
