"""The site file's vocabulary: the regular expressions for what its fields hold (image tags and repositories,
registry hosts, DNS labels, durations, URLs, OS tags, MIG profiles, label keys) and the checks that decide them.

The patterns are published in `gpu-install config schema`; the checks raise ValueError worded for the site file
(the site model in installer.config reports it at the field's path, exit 2)."""

from __future__ import annotations

import re

# OCI distribution grammar: a tag, a digest, a repository path (optionally with a registry host in front)
TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
DIGEST = r"sha256:[a-f0-9]{64}"
PATH_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"

# The same rules as JSON-schema patterns (ECMA-262 regular expressions, also valid for Python's re), published by
# `gpu-install config schema` so that an editor refuses what the checks below and the site model's validators refuse.
# Those decide and word the messages; these only describe them.
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# 1 to 65535 in at most 5 digits (leading zeros allowed, as int() reads them)
_PORT = r"(?=[0-9]{1,5}(?![0-9]))0*(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
#: registry_host(): [IPv6]:port, a dotted name with an optional port, a single label with a port, or localhost
_HOST_PORT = rf"\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\](?::{_PORT})?|{_LABEL}(?:\.{_LABEL})+(?::{_PORT})?|{_LABEL}:{_PORT}"
REGISTRY_HOST = rf"(?:{_HOST_PORT}|[Ll][Oo][Cc][Aa][Ll][Hh][Oo][Ss][Tt])"
_PATH_COMPONENT_NO_DOT = r"[a-z0-9]+(?:(?:_|__|-+)[a-z0-9]+)*"
#: repository_ref(): one path component, or components whose first one names a registry when it has a '.' or ':'
REPOSITORY = (rf"^(?:{PATH_COMPONENT}|{_PATH_COMPONENT_NO_DOT}(?:/{PATH_COMPONENT})+"
              rf"|(?:{_HOST_PORT}|localhost)(?:/{PATH_COMPONENT})+)$")
DNS_LABEL = r"^[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?$"
SECRET_NAME = r"^[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?$"
DURATION = r"^(?:[0-9]+(?:\.[0-9]+)?(?:ns|us|ms|s|m|h))+$"
URL_PREFIX = r"^https?://[^/\s?#@]+(?:/[^\s?#]*)?$"
EXTENDED_RESOURCE = (r"^(?![^/]*kubernetes\.io/)[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)+"
                     r"/[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
KUBERNETES_VERSION = r"^v?[0-9]+\.[0-9]+(?:\.[0-9]+)?(?:[-+][0-9A-Za-z.-]+)?$"
#: mirror.chartRepository: an http(s) chart repository (index.yaml under it) or oci://<registry>[/<path>] (the chart is
#: <that>/gpu-operator); chart_repository() decides, this describes it
CHART_REPOSITORY = (rf"^(?:https?://[^/\s?#@]+(?:/[^\s?#]*)?"
                    rf"|oci://{REGISTRY_HOST}(?:/{PATH_COMPONENT})*/?)$")
DEFAULT_CHART_REPOSITORY = "https://helm.ngc.nvidia.com/nvidia"
#: mirror.upstream values: where `mirror pull` reads an upstream registry's images instead, registry[:port][/path]
UPSTREAM_MIRROR = rf"^{REGISTRY_HOST}(?:/{PATH_COMPONENT})*$"

#: the name of an environment variable (pullSecret.usernameEnv/passwordEnv: never the credential itself)
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"

#: a MIG profile (1g.10gb, 3g.40gb, 1g.10gb+me) and a mig-parted config name (it becomes a label value)
MIG_PROFILE = r"^[0-9]+g\.[0-9]+gb(?:[+-](?:me|gfx|me\.all))?$"
MIG_CONFIG_NAME = r"^[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"

#: a label key as Kubernetes takes it: [DNS-subdomain prefix/]name
LABEL_KEY = (r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

#: an OS tag as the inventory's gpu_install_os gives it: os-release ID + VERSION_ID (ubuntu22.04, rocky9.4, debian12)
OS_TAG = r"^[a-z][a-z0-9]*[0-9]+(?:\.[0-9]+)*$"
#: an apt suite (jammy, bookworm-updates) or a flat repository's directory ending in '/' ("/", "./x86_64/")
APT_SUITE = r"^(?:[A-Za-z0-9][A-Za-z0-9._~+-]*|[A-Za-z0-9._~+/-]*/)$"
PACKAGE_URL = r"^(?:https?://[^/\s?#@]+(?:/[^\s?#]*)?|file:///[^\s?#]*)$"

#: how a message words a field's pattern (the site model's schema patterns, as pydantic reports a mismatch)
PATTERN_TEXT = {
    rf"^{TAG}$": "an image tag: letters, digits, '_', '.', '-' (at most 128, not starting with '.' or '-')",
    rf"^{PATH_COMPONENT}$": "an image name: lower-case letters and digits, joined by '.', '_' or '-'",
}

_DOMAIN_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
#: the user[:password]@ of a URL: everything between "scheme://" and the authority's last '@'. The scheme is bounded
#: (RFC 3986 sets no limit, real ones are short): unbounded, each start position in a long run of letters rescans it
#: to the end, quadratic on a 10 MB value.
_URL_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]{0,31}://)[^/\s?#\\]*@")


def strip_userinfo(text: str) -> str:
    """text with the user[:password]@ of every URL in it replaced with ***@: how a URL is printed, recorded or
    signed (a password with an unencoded '@' is hidden whole)."""
    if "://" not in text:
        return text
    return _URL_USERINFO.sub(lambda m: m.group("scheme") + "***@", text)


def no_userinfo(v: str, fix: str) -> str:
    """v, refused (ValueError, the URL shown without its credentials) when it is a URL carrying user[:password]@:
    a credential there would reach command lines (/proc), the progress, plans and the signed bundle lock. fix says
    where this kind of source takes its credentials instead."""
    scheme, sep, rest = v.partition("://")
    if sep and "@" in re.split(r"[/?#\\]", rest, maxsplit=1)[0]:
        raise ValueError("the URL carries a user name or password (user:password@), which would reach command "
                         f"lines, the progress, plans and the signed bundle lock: remove it; {fix}")
    return v


def image_tag(v: str, what: str = "version") -> str:
    """An image tag or digest (it becomes part of an image reference and of file names)."""
    if not (re.fullmatch(TAG, v) or re.fullmatch(DIGEST, v)):
        shown = v if len(v) <= 60 else v[:57] + "..."
        raise ValueError(f"{shown!r} is not an image {what}: letters, digits, '_', '.', '-' (at most 128, not "
                         "starting with '.' or '-'), or sha256:<64 hex digits>")
    return v


def repository_ref(v: str) -> str:
    """A source repository: [registry-host[:port]/]path/components (lower case)."""
    first, _, rest = v.partition("/")
    path = v
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry_host(first)
        path = rest
    if len(v) > 255 or not re.fullmatch(rf"{PATH_COMPONENT}(?:/{PATH_COMPONENT})*", path):
        shown = v if len(v) <= 60 else v[:57] + "..."
        raise ValueError(f"{shown!r} is not an image repository such as nvcr.io/nvidia/cloud-native "
                         "(lower-case path components, an optional registry host in front)")
    return v


def dns_label(v: str) -> str:
    """A Kubernetes name that must be a DNS-1123 label (namespace, Helm release, ConfigMap)."""
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", v):
        raise ValueError(f"{v!r} is not a valid DNS-1123 label (lower case letters, digits, '-')")
    return v


def registry_host(v: str) -> str:
    """A registry as image references name it (the rules docker and containerd apply): host[:port] where host is a
    DNS name, an IPv4 address or a bracketed IPv6 address, and a name without a dot or port other than localhost
    would be read as a Docker Hub path. Lower-cased."""
    shown = v if len(v) <= 80 else v[:77] + "..."
    if len(v) > 255:
        raise ValueError(f"{shown!r}: {len(v)} characters is not a registry host (at most 255)")
    if "://" in v or "/" in v:
        raise ValueError(f"{shown!r}: give host[:port] only, without scheme or path (use prefix for a path)")
    m = re.fullmatch(r"(\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]|[^:\[\]]+)(?::([0-9]+))?", v)  # IPv6: has a ':'
    if not m:
        raise ValueError(f"{shown!r} is not a host[:port]")
    host, port = m.group(1), m.group(2)
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536 and len(port) <= 5):
        raise ValueError(f"{shown!r}: port {port} is not between 1 and 65535")
    if not host.startswith("["):
        labels = host.split(".")
        if not all(_DOMAIN_LABEL.fullmatch(label) for label in labels):
            raise ValueError(f"{shown!r}: {host!r} is not a host name (labels of letters, digits and '-', not "
                             "starting or ending with '-', separated by single dots)")
        if len(labels) == 1 and port is None and host.lower() != "localhost":
            raise ValueError(f"{shown!r} would be read as a Docker Hub path (docker.io/{host}/…), not as a registry: "
                             f"give its full name ({host}.example.com) or its port ({host}:5000)")
    return v.lower()


def chart_repository(v: str) -> str:
    """A Helm chart repository: http(s)://host[/path] (an index.yaml repository) or oci://registry[:port][/path]
    (an OCI registry holding the chart as <that>/gpu-operator). A trailing '/' is dropped."""
    shown = v if len(v) <= 80 else v[:77] + "..."
    if len(v) > 2048:
        raise ValueError(f"{shown!r}: {len(v)} characters is not a chart repository (at most 2048)")
    if v.startswith("oci://"):
        host, slash, path = v[len("oci://"):].removesuffix("/").partition("/")
        try:
            host = registry_host(host)
        except ValueError as exc:
            raise ValueError(f"{shown!r}: the registry of an oci:// chart repository: {exc}") from None
        if slash and not re.match(rf"{PATH_COMPONENT}(?:/{PATH_COMPONENT})*\Z", path):
            raise ValueError(f"{shown!r}: {path!r} is not a repository path (lower-case components joined by '/')")
        return "oci://" + host + (f"/{path}" if path else "")
    if not re.match(r"https?://[^/\s?#]+(?:/[^\s?#]*)?\Z", v):
        raise ValueError(f"{shown!r} is not a chart repository: an http(s) URL such as {DEFAULT_CHART_REPOSITORY} or "
                         "oci://registry.example.com:5000/charts")
    return v.rstrip("/") if v.rstrip("/") not in ("http:/", "https:/") else v


def package_url(v: str) -> str:
    """An upstream package repository's URL: http(s)://host[/path] or file:///path; no trailing '/'."""
    shown = v if len(v) <= 80 else v[:77] + "..."
    if len(v) > 2048 or not re.match(PACKAGE_URL, v):
        raise ValueError(f"{shown!r} is not a package repository URL: http(s)://host/path or file:///path")
    return v.rstrip("/") if v.rstrip("/") not in ("http:/", "https:/", "file:/") else v


def upstream_mirror(v: str) -> str:
    """Where an upstream registry's images are read instead: registry[:port] with an optional repository path in
    front of theirs (mirror.internal:5000/nvcr). The registry is lower-cased; no scheme, no trailing '/'."""
    shown = v if len(v) <= 80 else v[:77] + "..."
    if len(v) > 2048:
        raise ValueError(f"{shown!r}: {len(v)} characters is not a registry (at most 2048)")
    host, slash, path = v.partition("/")
    if "://" in v:
        raise ValueError(f"{shown!r}: give registry[:port][/path] without a scheme (skopeo speaks HTTPS)")
    host = registry_host(host)
    if slash and not re.match(rf"{PATH_COMPONENT}(?:/{PATH_COMPONENT})*\Z", path):
        raise ValueError(f"{shown!r}: {path!r} is not a repository path (lower-case components joined by '/')")
    return host + (f"/{path}" if slash else "")
