"""The only module that imports the `kubernetes` client (the lab's own control plane aside).

Kubeconfig resolution, the operator namespace and the image pull Secret. Registry credentials are
read at run time from the environment variables or the docker config file that the site's
`registry.pullSecret` names; they exist only in memory and in the API request that stores the
Secret -- never in a message, a log line or a file of ours. Every ensure_* is create-or-update:
running it again with the same input changes nothing and says so.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from installer import limits
from installer.config import Registry
from installer.errors import ClusterError, ClusterUnreachable, ConfigError
from installer.safefile import MAX_INPUT_BYTES

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

ENV_KUBECONFIG = "KUBECONFIG"
SECRET_TYPE = "kubernetes.io/dockerconfigjson"
SECRET_KEY = ".dockerconfigjson"
MANAGED_BY = {"app.kubernetes.io/managed-by": "gpu-install"}
TRANSIENT = {429, 500, 502, 503, 504}

# ---------------------------------------------------------------- kubeconfig


def resolve_kubeconfig(path: str | os.PathLike[str] | None = None,
                       environ: Mapping[str, str] | None = None) -> Path:
    """--kubeconfig, else $KUBECONFIG (first existing entry), else ~/.kube/config."""
    env = os.environ if environ is None else environ
    if path:
        candidates, where = [Path(path)], "--kubeconfig"
    elif env.get(ENV_KUBECONFIG):
        candidates = [Path(p) for p in env[ENV_KUBECONFIG].split(os.pathsep) if p]
        where = f"${ENV_KUBECONFIG}"
    else:
        candidates, where = [Path.home() / ".kube" / "config"], "default"
    for c in candidates:
        if c.is_file():
            return c
    shown = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"kubeconfig not found ({where}: {shown})",
                      hint=f"pass --kubeconfig PATH or set {ENV_KUBECONFIG}")


def _unreachable(server: str, exc: Exception, timeout: tuple[float, float]) -> ClusterUnreachable:
    """A urllib3 error of one request (after its retries) as exit 5, naming the server."""
    from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, NewConnectionError, ReadTimeoutError

    reason = exc.reason if isinstance(exc, MaxRetryError) and exc.reason is not None else exc
    # NewConnectionError (refused, no route, DNS) is a ConnectTimeoutError to urllib3, for history's sake
    if isinstance(reason, ReadTimeoutError | ConnectTimeoutError | TimeoutError) and \
            not isinstance(reason, NewConnectionError):
        # urllib3 names the limit that ran out ("read timeout=10"): the TLS handshake runs under the connect one
        fired = re.search(r"timeout=([0-9.]+)", str(reason))
        seconds = float(fired.group(1)) if fired else timeout[0 if isinstance(reason, ConnectTimeoutError) else 1]
        why = f"no answer in {seconds:g} s"
    else:
        text = " ".join(str(reason).split())
        why = text.rsplit(": ", 1)[-1][:200] or type(reason).__name__  # "[Errno 111] Connection refused"
    return ClusterUnreachable(
        f"cannot reach the Kubernetes API server {server} ({why})",
        hint=f"check the kubeconfig's server and that the cluster is up (and answering); the limits are "
             f"${limits.ENV_API_TIMEOUT}=CONNECT,READ seconds (now {timeout[0]:g},{timeout[1]:g})")


def _client_class() -> Any:
    """ApiClient whose every request has a (connect, read) timeout unless the call gives its own, and whose
    connection failures and timeouts are ClusterUnreachable (exit 5) naming the server."""
    from kubernetes.client import ApiClient
    from urllib3.exceptions import HTTPError

    class TimedApiClient(ApiClient):
        request_timeout: tuple[float, float] = limits.DEFAULT_API_TIMEOUT

        def call_api(self, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("_request_timeout") is None:
                kwargs["_request_timeout"] = self.request_timeout
            try:
                return super().call_api(*args, **kwargs)
            except HTTPError as exc:  # refused, reset, DNS, a timeout: after urllib3's retries
                raise _unreachable(str(self.configuration.host), exc, self.request_timeout) from None

    return TimedApiClient


def _retry_class(base: Any) -> Any:
    """urllib3's Retry (HTTP statuses are _call's business), except that a request that got no answer in the read
    limit is never sent again: that would wait the limit again (and a write may have been done). A connection the
    server closed while idle (a pooled keep-alive one) is still retried, as urllib3 does for idempotent methods."""
    from urllib3.exceptions import ReadTimeoutError

    class NoSecondWait(base):  # type: ignore[misc]
        def increment(self, *args: Any, **kwargs: Any) -> Any:
            error = kwargs.get("error")
            if isinstance(error, ReadTimeoutError):
                raise error
            return super().increment(*args, **kwargs)

    return NoSecondWait


def api_client(kubeconfig: Path) -> ApiClient:
    """A client for the kubeconfig's current context. Every request: connect and read timeouts (limits.api_timeout());
    a connection error retried once, a read timeout never (_retry_class), HTTP statuses left to _call."""
    import yaml
    from kubernetes import config
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException
    from urllib3.util.retry import Retry

    timeout = limits.api_timeout()
    try:
        cfg = type.__call__(Configuration)  # not the process-wide default (new_client_from_config does the same)
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    except (ConfigException, OSError, ValueError, TypeError, yaml.YAMLError) as exc:
        text = " ".join(str(exc).split())
        raise ConfigError(f"kubeconfig {kubeconfig}: {text[:500]}", hint="check the file (kubectl config view)") from None
    cfg.retries = _retry_class(Retry)(total=3, connect=1, status=0, raise_on_status=False)
    client = _client_class()(configuration=cfg)
    client.request_timeout = timeout
    return client  # type: ignore[no-any-return]


# ---------------------------------------------------------------- the pull secret (pure)


def _auth_host(key: str) -> str:
    """The registry host of an `auths` key: `https://r.lab:5000/v1/`, `r.lab:5000/team` and `r.lab:5000` all name
    r.lab:5000 (docker and containers-auth.json spell keys all three ways)."""
    return key.split("://", 1)[-1].rstrip("/").split("/", 1)[0].lower()


def docker_config_json(registry: Registry, environ: Mapping[str, str] | None = None) -> bytes:
    """The `.dockerconfigjson` payload for registry.pullSecret (credentials resolved now)."""
    ps = registry.pullSecret
    if ps is None:
        raise ConfigError("registry.pullSecret is not set: there is no pull Secret to create",
                          hint="add registry.pullSecret (name + usernameEnv/passwordEnv or dockerConfigFile)")
    if ps.dockerConfigFile:
        return _from_file(Path(ps.dockerConfigFile), registry.host)
    env = os.environ if environ is None else environ
    if not (ps.usernameEnv and ps.passwordEnv):
        raise ConfigError(f"registry.pullSecret {ps.name}: no credentials to create it from",
                          hint="add usernameEnv + passwordEnv (names of environment variables) or dockerConfigFile; "
                               "a name alone is enough for render, not for creating the Secret")
    for field, name in (("usernameEnv", ps.usernameEnv), ("passwordEnv", ps.passwordEnv)):
        if not env.get(name):
            # the variable's name is not shown: when a credential was pasted into the field, it would be the secret
            raise ConfigError(
                f"registry.pullSecret.{field}: the environment variable it names is not set (or empty)",
                hint=f"export that variable with the registry {'user name' if field == 'usernameEnv' else 'password/token'}"
                     " before running (the field holds the variable's NAME); it is read at run time and never stored")
    user, password = env[ps.usernameEnv], env[ps.passwordEnv]
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    doc = {"auths": {registry.host: {"username": user, "password": password, "auth": auth}}}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _from_file(path: Path, host: str) -> bytes:
    # the path is not shown until the file has been read as a docker config.json: like the other credential fields,
    # this one may hold a credential pasted by mistake
    where = "registry.pullSecret.dockerConfigFile"
    hint = ("check the path the field names (a relative one is relative to the site file) and its permissions; the "
            "field holds the PATH of a docker config.json")
    try:
        st = path.stat()
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block, a device never end
            raise ConfigError(f"{where}: not a regular file", hint=hint)
        if st.st_size > MAX_INPUT_BYTES:
            raise ConfigError(f"{where}: {st.st_size} bytes is not a docker config.json", hint=hint)
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it ({exc.strerror})", hint=hint) from None
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{where}: not valid JSON", hint="give a docker config.json ({\"auths\": {...}})") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply to be a docker config.json",
                          hint="give a docker config.json ({\"auths\": {...}})") from None
    auths = doc.get("auths") if isinstance(doc, dict) else None
    if not isinstance(auths, dict) or not auths:
        raise ConfigError(f"{where} {path}: no \"auths\" entries",
                          hint="kubelets need inline credentials; credsStore/credHelpers cannot be used in a Secret")
    # only the site registry's entries: the file is usually the admin's own ~/.docker/config.json, and its other
    # registries' credentials have no business in the cluster's Secret or in skopeo's authfile
    mine = {key: entry for key, entry in auths.items() if _auth_host(key) == host.lower()}
    if not mine:
        raise ConfigError(f"{where} {path}: no auths entry for the site registry {host} "
                          f"(entries: {', '.join(sorted(auths))})",
                          hint=f"log in to {host} with that config file (docker login --config DIR {host}; the file "
                               f"is DIR/config.json), or point registry.host at the right registry")
    if not all(isinstance(entry, dict) for entry in mine.values()):
        raise ConfigError(f"{where} {path}: the auths entry for {host} is not an object",
                          hint=f"log in to {host} again with that config file (docker login)")
    return json.dumps({"auths": mine}, sort_keys=True, separators=(",", ":")).encode()


def pull_secret_body(registry: Registry, namespace: str, environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The Secret object (a dict for the API): type kubernetes.io/dockerconfigjson."""
    assert registry.pullSecret is not None
    payload = docker_config_json(registry, environ)
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": registry.pullSecret.name, "namespace": namespace, "labels": dict(MANAGED_BY)},
        "type": SECRET_TYPE,
        "data": {SECRET_KEY: base64.b64encode(payload).decode()},
    }


# ---------------------------------------------------------------- API calls


def _describe(exc: Exception) -> str:
    """An ApiException as 'HTTP 403 Forbidden: <apiserver message>' (never the request body)."""
    status, reason, body = getattr(exc, "status", None), getattr(exc, "reason", None), getattr(exc, "body", None)
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = ""
    if status:
        return f"HTTP {status} {reason or ''}".rstrip() + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"


def _call(what: str, fn: Callable[[], Any], attempts: int = 10, delay: float = 1.0) -> Any:
    """Run one API call; retry transient answers (a fresh namespace can give a 500 for a moment)."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except ApiException as exc:
            if exc.status in TRANSIENT and attempt < attempts:
                time.sleep(delay)
                continue
            raise
        except HTTPError as exc:  # a client not made by api_client(): connection refused / reset, a timeout
            raise ClusterUnreachable(f"{what}: cannot reach the Kubernetes API server ({type(exc).__name__})",
                                     hint="check the kubeconfig's server and that the cluster is up") from None
        except ClusterUnreachable as exc:  # api_client()'s: the server and the limit are named
            raise ClusterUnreachable(f"{what}: {exc.message}", hint=exc.hint) from None
    raise AssertionError("unreachable")


def _api_error(what: str, exc: Exception) -> ClusterError:
    status = getattr(exc, "status", None)
    hint = {401: "the kubeconfig's credentials were refused", 403: "the kubeconfig's user lacks the permission"}.get(
        status or 0, "see the API server's message")
    return ClusterError(f"{what}: {_describe(exc)}", hint=hint)


def server_version(client: ApiClient) -> str:
    """The API server's version (gitVersion, e.g. v1.20.2): read-only, allowed for any authenticated user."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    try:
        info = _call("read the server version", lambda: k.VersionApi(client).get_code(), attempts=3)
    except ApiException as exc:
        raise _api_error("read the server version", exc) from None
    return str(info.git_version or f"v{info.major}.{info.minor}")


def ensure_namespace(client: ApiClient, name: str, timeout: float = 120) -> str:
    """Create the namespace if missing (waiting out one that is being deleted). 'created'|'unchanged'."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    core = k.CoreV1Api(client)
    deadline = time.monotonic() + timeout
    while True:
        try:
            ns = _call(f"read namespace {name}", lambda: core.read_namespace(name))
        except ApiException as exc:
            if exc.status != 404:
                raise _api_error(f"read namespace {name}", exc) from None
            ns = None
        if ns is not None and ns.status and ns.status.phase == "Terminating":
            if time.monotonic() > deadline:
                raise ClusterError(f"namespace {name} is still being deleted after {timeout:.0f}s",
                                      hint="wait for the deletion to finish, then re-run")
            time.sleep(1)
            continue
        if ns is not None:
            return "unchanged"
        body: Any = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(MANAGED_BY)}}
        try:
            _call(f"create namespace {name}", functools.partial(core.create_namespace, body))
            return "created"
        except ApiException as exc:
            if exc.status == 409:  # created meanwhile (or terminating): look again
                continue
            raise _api_error(f"create namespace {name}", exc) from None


def ensure_secret(client: ApiClient, body: Any) -> str:
    """Create or update a Secret from its full body. 'created' | 'updated' | 'unchanged'."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    namespace = body["metadata"]["namespace"]
    name = body["metadata"]["name"]
    core = k.CoreV1Api(client)
    what = f"Secret {namespace}/{name}"
    for _ in range(5):
        try:
            cur = _call(f"read {what}", lambda: core.read_namespaced_secret(name, namespace))
        except ApiException as exc:
            if exc.status != 404:
                raise _api_error(f"read {what}", exc) from None
            cur = None
        try:
            if cur is None:
                _call(f"create {what}", lambda: core.create_namespaced_secret(namespace, body))
                return "created"
            labels = dict(cur.metadata.labels or {})
            same = (cur.type == body["type"] and (cur.data or {}) == body["data"]
                    and all(labels.get(key) == v for key, v in MANAGED_BY.items()))
            if same:
                return "unchanged"
            if cur.type != body["type"]:  # the type of a Secret is immutable
                _call(f"delete {what}", lambda: core.delete_namespaced_secret(name, namespace))
                _call(f"create {what}", lambda: core.create_namespaced_secret(namespace, body))
                return "updated"
            body["metadata"]["labels"] = {**labels, **MANAGED_BY}
            body["metadata"]["resourceVersion"] = cur.metadata.resource_version
            _call(f"update {what}", lambda: core.replace_namespaced_secret(name, namespace, body))
            return "updated"
        except ApiException as exc:
            if exc.status in (404, 409):  # raced with someone else: read again
                body["metadata"].pop("resourceVersion", None)
                continue
            raise _api_error(f"write {what}", exc) from None
    raise ClusterError(f"{what}: kept changing under us", hint="something else is writing it; re-run")


def secret_info(client: ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    """Type, labels and registry hosts of a Secret -- never its credentials. None when absent."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    try:
        s = _call(f"read Secret {namespace}/{name}", lambda: k.CoreV1Api(client).read_namespaced_secret(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _api_error(f"read Secret {namespace}/{name}", exc) from None
    hosts: list[str] = []
    raw = (s.data or {}).get(SECRET_KEY)
    if raw:
        try:
            hosts = sorted(json.loads(base64.b64decode(raw)).get("auths", {}))
        except ValueError:
            hosts = []
    return {"type": s.type, "labels": dict(s.metadata.labels or {}), "registries": hosts}


def namespace_phase(client: ApiClient, name: str) -> str | None:
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    try:
        ns = _call(f"read namespace {name}", lambda: k.CoreV1Api(client).read_namespace(name))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _api_error(f"read namespace {name}", exc) from None
    return ns.status.phase if ns.status else None


def delete_secret_if_ours(client: ApiClient, namespace: str, name: str) -> bool:
    """Delete the pull Secret when gpu-install made it (label). True when deleted."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    info = secret_info(client, namespace, name)
    if info is None or any(info["labels"].get(key) != v for key, v in MANAGED_BY.items()):
        return False
    try:
        _call(f"delete Secret {namespace}/{name}", lambda: k.CoreV1Api(client).delete_namespaced_secret(name, namespace))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise _api_error(f"delete Secret {namespace}/{name}", exc) from None
    return True


def delete_namespace(client: ApiClient, name: str) -> bool:
    """Start deleting the namespace (the API server finishes it). True when it existed."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    try:
        _call(f"delete namespace {name}", lambda: k.CoreV1Api(client).delete_namespace(name))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise _api_error(f"delete namespace {name}", exc) from None
    return True


# ---------------------------------------------------------------- node labels (MIG layouts: installer/mig.py)


def node_labels(client: ApiClient, names: list[str]) -> dict[str, dict[str, str] | None]:
    """The labels of each named Node (None: no such Node)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    api = k8s.CoreV1Api(client)
    out: dict[str, dict[str, str] | None] = {}
    for name in names:
        try:
            node = _call(f"read node {name}", functools.partial(api.read_node, name))
        except ApiException as exc:
            if exc.status == 404:
                out[name] = None
                continue
            raise _api_error(f"read node {name}", exc) from None
        out[name] = dict(node.metadata.labels or {})
    return out


def set_node_label(client: ApiClient, name: str, key: str, value: str | None) -> None:
    """Set one label on a Node, or remove it with value None (a strategic-merge patch of metadata.labels: other
    labels untouched)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    api = k8s.CoreV1Api(client)
    try:
        _call(f"label node {name}", lambda: api.patch_node(name, {"metadata": {"labels": {key: value}}}))
    except ApiException as exc:
        raise _api_error(f"label node {name} {key}={value}", exc) from None


# ---------------------------------------------------------------- CRDs (the chart's crds/, applied server-side)

FIELD_MANAGER = "gpu-install"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
# helm deletes a resource an upgrade no longer renders unless it carries this: the NFD subchart of v22.9 and
# older rendered its NodeFeatureRule CRD from a template (a release resource), later charts carry it in crds/
HELM_KEEP = {"helm.sh/resource-policy": "keep"}


UNDECLARED = re.compile(r"^\s*\.(\S+): field not declared in schema", re.M)


def _drop(obj: Any, path: str) -> None:
    """Remove the field at a server-side-apply error path (`spec.versions[0].schema.x`) from obj."""
    keys: list[str | int] = []
    for part in path.split("."):
        name, _, rest = part.partition("[")
        if name:
            keys.append(name)
        keys.extend(int(i) for i in re.findall(r"(\d+)\]", "[" + rest) if rest)
    for key in keys[:-1]:
        try:
            obj = obj[key]
        except (KeyError, IndexError, TypeError):
            return
    if isinstance(obj, dict):
        obj.pop(keys[-1], None)


def _json(resp: Any) -> Any:
    return json.loads(resp.data) if resp.data else None


def _crd_raw(client: ApiClient, name: str) -> dict[str, Any] | None:
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    api = k.ApiextensionsV1Api(client)
    try:
        return _json(_call(f"read CRD {name}", lambda: api.read_custom_resource_definition(name, _preload_content=False)))  # type: ignore[no-any-return]
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise _api_error(f"read CRD {name}", exc) from None


def _crd_view(obj: Mapping[str, Any] | None) -> Any:
    """What an apply can change that matters: spec, labels, annotations (never status or managedFields)."""
    if obj is None:
        return None
    meta = obj.get("metadata") or {}
    return (obj.get("spec"), meta.get("labels") or {}, meta.get("annotations") or {})


def apply_crds(client: ApiClient, crds: list[dict[str, Any]], dry_run: bool = False,
               timeout: float = 60) -> list[tuple[str, str]]:
    """Server-side apply of each CRD (field manager gpu-install, conflicts forced: helm created them on a first
    install) with helm.sh/resource-policy=keep; with dry_run the API server computes the result (dryRun=All) and
    nothing is stored. Returns (name, created|updated|unchanged) -- from the stored spec, labels and annotations
    before and after. After a real apply, waits until every CRD is Established (the release's custom resources
    need it)."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    api = k.ApiextensionsV1Api(client)
    out: list[tuple[str, str]] = []
    for crd in crds:
        name = crd["metadata"]["name"]
        body = {**crd, "metadata": {**crd["metadata"],
                                    "annotations": {**(crd["metadata"].get("annotations") or {}), **HELM_KEEP}}}
        body["metadata"].pop("creationTimestamp", None)
        body.pop("status", None)
        before = _crd_raw(client, name)
        what = f"server-side apply CRD {name}" + (" (dry run)" if dry_run else "")
        for attempt in range(2):
            try:
                after = _json(_call(what, functools.partial(
                    api.patch_custom_resource_definition, name, body, field_manager=FIELD_MANAGER, force=True,
                    dry_run="All" if dry_run else None, _content_type="application/apply-patch+yaml",
                    _preload_content=False)))
                break
            except ApiException as exc:
                # an older API server does not know some schema fields of a newer chart (x-kubernetes-validations
                # before 1.23): server-side apply refuses them where a create would drop them silently -- drop
                # them here too, once
                unknown = UNDECLARED.findall(_describe(exc))
                if attempt or not unknown:
                    raise _api_error(what, exc) from None
                for path in unknown:
                    _drop(body, path)
        action = ("created" if before is None else
                  "unchanged" if _crd_view(before) == _crd_view(after) else "updated")
        out.append((name, action))
    if not dry_run:
        wait_crds_established(client, [n for n, _ in out], timeout)
    return out


def wait_crds_established(client: ApiClient, names: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for name in names:
        while True:
            obj = _crd_raw(client, name) or {}
            conds = (obj.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Established" and c.get("status") == "True" for c in conds):
                break
            if time.monotonic() > deadline:
                raise ClusterError(f"CRD {name} is not Established after {timeout:.0f}s",
                                   hint="check the API server's log (kubectl describe crd " + name + ")")
            time.sleep(0.5)


def existing_crds(client: ApiClient, names: list[str]) -> list[str]:
    """The named CRDs that exist, in the given order."""
    return [n for n in names if _crd_raw(client, n) is not None]


def custom_resources(client: ApiClient, names: list[str]) -> list[tuple[str, dict[str, str]]]:
    """Every custom resource of each named CRD (absent CRDs skipped), across namespaces, as
    (`Kind/namespace/name` -- `Kind/name` when cluster-scoped --, its annotations), listed through the CRD's
    storage version."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    api = k.CustomObjectsApi(client)
    out: list[tuple[str, dict[str, str]]] = []
    for name in names:
        crd = _crd_raw(client, name)
        if crd is None:
            continue
        spec = crd["spec"]
        versions = spec.get("versions") or []
        version = next((v["name"] for v in versions if v.get("storage")),
                       next((v["name"] for v in versions if v.get("served")), None))
        if version is None:
            continue
        group, plural, kind = spec["group"], spec["names"]["plural"], spec["names"]["kind"]
        what = f"list {kind} ({name})"
        try:
            items = _json(_call(what, functools.partial(
                api.list_cluster_custom_object, group, version, plural, _preload_content=False)))["items"]
        except ApiException as exc:
            if exc.status == 404:
                continue
            raise _api_error(what, exc) from None
        for it in items:
            meta = it.get("metadata") or {}
            ns = meta.get("namespace")
            out.append((f"{kind}/{ns}/{meta.get('name')}" if ns else f"{kind}/{meta.get('name')}",
                        dict(meta.get("annotations") or {})))
    return out


def delete_crds(client: ApiClient, names: list[str], timeout: float = 120) -> list[str]:
    """Delete the named CRDs and wait until they are gone; returns those that existed."""
    from kubernetes import client as k
    from kubernetes.client.exceptions import ApiException

    api = k.ApiextensionsV1Api(client)
    deleted: list[str] = []
    for name in names:
        try:
            _call(f"delete CRD {name}", functools.partial(
                api.delete_custom_resource_definition, name, _preload_content=False))
            deleted.append(name)
        except ApiException as exc:
            if exc.status != 404:
                raise _api_error(f"delete CRD {name}", exc) from None
    deadline = time.monotonic() + timeout
    while (left := existing_crds(client, deleted)):
        if time.monotonic() > deadline:
            raise ClusterError(f"CRD(s) still being deleted after {timeout:.0f}s: {', '.join(left)}",
                               hint="check for finalizers on the CRDs; re-running is safe")
        time.sleep(0.5)
    return deleted


def _dynamic_resource(client: ApiClient, obj: dict[str, Any]) -> Any:
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    try:
        return DynamicClient(client).resources.get(  # type: ignore[no-untyped-call]
            api_version=obj["apiVersion"], kind=obj["kind"])
    except ResourceNotFoundError:
        raise ClusterError(f"the cluster serves no {obj['kind']} ({obj['apiVersion']})",
                           hint="install what provides it first (e.g. the Prometheus Operator's CRDs)") from None


def apply_object(client: ApiClient, obj: dict[str, Any], dry_run: bool = False) -> str:
    """Server-side apply of one namespaced object (field manager gpu-install, conflicts forced); with dry_run the API
    server computes the result and stores nothing. 'created' | 'updated' | 'unchanged' (resourceVersion before and
    after)."""
    from kubernetes.client.exceptions import ApiException

    res = _dynamic_resource(client, obj)
    meta = obj["metadata"]
    what = f"server-side apply {obj['kind']} {meta['namespace']}/{meta['name']}" + (" (dry run)" if dry_run else "")

    def view(o: Any) -> Any:  # what the apply can change (a dry run assigns no new resourceVersion)
        d = o.to_dict()
        m = d.get("metadata") or {}
        return (m.get("labels"), m.get("annotations"), d.get("data"), d.get("spec"))

    try:
        before = view(res.get(name=meta["name"], namespace=meta["namespace"]))
    except ApiException as exc:
        if exc.status != 404:
            raise _api_error(what, exc) from None
        before = None
    try:
        after = _call(what, functools.partial(
            res.server_side_apply, body=obj, name=meta["name"], namespace=meta["namespace"],
            field_manager=FIELD_MANAGER, force_conflicts=True, dry_run="All" if dry_run else None))
    except ApiException as exc:
        raise _api_error(what, exc) from None
    if before is None:
        return "created"
    return "unchanged" if view(after) == before else "updated"


def delete_object_if_ours(client: ApiClient, obj: dict[str, Any]) -> bool:
    """Delete a namespaced object gpu-install made (label app.kubernetes.io/managed-by=gpu-install). True when
    deleted; a kind the cluster does not serve, or a missing object, is nothing to delete."""
    from kubernetes.client.exceptions import ApiException

    try:
        res = _dynamic_resource(client, obj)
    except ClusterError:
        return False
    meta = obj["metadata"]
    what = f"delete {obj['kind']} {meta['namespace']}/{meta['name']}"
    try:
        cur = res.get(name=meta["name"], namespace=meta["namespace"])
        labels = dict(cur.metadata.labels or {})
        if any(labels.get(k) != v for k, v in MANAGED_BY.items()):
            return False
        _call(what, lambda: res.delete(name=meta["name"], namespace=meta["namespace"]))
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise _api_error(what, exc) from None
    return True
