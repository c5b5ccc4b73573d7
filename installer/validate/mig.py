"""MIG layer: on every GPU node with a MIG layout (site `mig.config`, inventory `gpu_install_mig_config`), did the
GPU Operator's mig-manager apply it, and does the device plugin advertise what it yields? (pure functions on the
Node objects the cluster layer lists; no extra API calls)

- `mig.config-label`: the Node carries `nvidia.com/mig.config` = the layout the site gives it (what
  `gpu-install mig label` / apply set and mig-manager acts on);
- `mig.config-state`: mig-manager's verdict `nvidia.com/mig.config.state` is `success` (pending / rebooting: still
  applying; failed: its log says why; missing: mig-manager never processed the node);
- `mig.allocatable`: the MIG devices the layout yields are allocatable, by the site's MIG strategy: `mixed` advertises
  `nvidia.com/mig-<profile>`, `single` advertises them as `nvidia.com/gpu` (and GFD's product label gets
  `-MIG-<profile>`); all-disabled: whole GPUs, no MIG resources. For `all-<profile>` layouts the count is exact:
  GPUs (GFD's `nvidia.com/gpu.count`) x the most instances of that profile one GPU of the model holds
  (values/mig/models.yaml); other layouts (all-balanced, custom ConfigMaps, or a node without GFD labels) are checked
  for MIG devices being there at all.
A pod using a MIG device is the smoke layer's job: on a node that advertises only MIG devices its pod asks one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from installer.mig import _PRODUCT_SUFFIX, LABEL, PRODUCT_LABEL
from installer.validate.report import CLUSTER, Check

LAYER = "mig"
CONFIG = LABEL
STATE = "nvidia.com/mig.config.state"
COUNT = "nvidia.com/gpu.count"
PRODUCT = PRODUCT_LABEL
GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
_ALL_PROFILE = re.compile(r"^all-([0-9]+g\.[0-9]+gb)(\.me)?$")


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def per_gpu(config: str, product: str | None) -> tuple[str, int] | None:
    """(profile, devices per GPU) an `all-<profile>` layout yields on this GPU model, or None when that cannot be told
    (another layout, an unknown model, a profile the model lacks)."""
    from installer import mig

    m = _ALL_PROFILE.match(config)
    model = mig.model_of(product)
    if not m or model is None:
        return None
    profile = m.group(1)
    counts = _profiles(model.name)
    key = f"{profile}+me" if m.group(2) and f"{profile}+me" in counts else profile
    n = counts.get(key)
    if not n:
        return None
    if key != profile:  # `.me`: one media-extension instance per GPU, advertised as mig-<profile>.me
        return f"{profile}.me", 1
    return profile, n


def _profiles(model_name: str) -> dict[str, int]:
    import yaml

    from installer import content

    doc = yaml.safe_load(content.mig_models_file().read_text())
    for m in doc["models"]:
        if m["model"] == model_name:
            return {str(k): int(v) for k, v in (m.get("profiles") or {}).items()}
    return {}


SETTLED = ("success", "failed")  # mig-manager's verdicts; pending / rebooting / no label yet: still to come


def wait_states(list_nodes: Callable[[], Sequence[Any]], nodes: Sequence[str], timeout: float,
                progress: Callable[[str], None] | None = None, interval: float = 1.0) -> dict[str, Any]:
    """Right after apply's mig stage labelled the nodes: wait up to timeout seconds until mig-manager gave each of
    nodes its verdict (STATE success or failed; a node the cluster does not have is not waited for). Returns the Node
    objects as last listed, for the checks to judge (a node still without a verdict then fails its check)."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        objs = {n.metadata.name: n for n in list_nodes()}
        waiting = [f"{n} ({(objs[n].metadata.labels or {}).get(STATE) or 'no state yet'})" for n in nodes
                   if n in objs and (objs[n].metadata.labels or {}).get(STATE) not in SETTLED]
        if not waiting or time.monotonic() >= deadline:
            if said and progress:
                progress("mig: " + (f"still no verdict of mig-manager on {', '.join(waiting)}" if waiting else
                                    "mig-manager's verdict on every node"))
            return objs
        if not said and progress:
            progress(f"mig: waiting up to {timeout:.0f}s for mig-manager's verdict ({STATE}) on {', '.join(waiting)}")
        said = True
        time.sleep(interval)


def node_checks(node: str, config: str, strategy: str, labels: Mapping[str, str],
                allocatable: Mapping[str, Any]) -> list[Check]:
    """The MIG checks of one node whose layout is config."""

    def check(check_id: str, status: Any, message: str, fix: str = "") -> Check:
        return Check(LAYER, check_id, node, status, message, fix)

    out: list[Check] = []
    have = labels.get(CONFIG)
    if have == config:
        out.append(check("mig.config-label", "pass", f"{CONFIG}={config}"))
    else:
        out.append(check("mig.config-label", "fail",
                         f"{node}: {CONFIG} is {have!r}, the site gives {config}" if have else
                         f"{node}: no {CONFIG} label, the site gives {config}",
                         "label the node: gpu-install mig label -s site.yaml -i inventory (apply does it too)"))
    state = labels.get(STATE)
    if state == "success":
        out.append(check("mig.config-state", "pass", f"{STATE}=success"))
    elif state in ("pending", "rebooting"):
        out.append(check("mig.config-state", "fail", f"{node}: mig-manager is still applying the layout ({STATE}="
                         f"{state})", "wait until it is success and validate again; a GPU reset or reboot may be "
                         "needed (mig-manager's log on the node)"))
    elif state == "failed":
        out.append(check("mig.config-state", "fail", f"{node}: mig-manager could not apply {have or config} ({STATE}="
                         "failed)", "read the nvidia-mig-manager pod's log on this node (GPUs in use, a profile the "
                         "GPU cannot hold, a reset that failed); fix, then relabel"))
    else:
        out.append(check("mig.config-state", "fail", f"{node}: no {STATE} label: mig-manager has not processed the "
                         "node", "check that the operator deploys mig-manager (components.migManager, "
                         "nvidia.com/gpu.deploy.mig-manager on the node) and its pod on this node"))
    migs = {k[len(MIG_PREFIX):]: _int(v) for k, v in allocatable.items() if k.startswith(MIG_PREFIX) and _int(v) > 0}
    gpus = _int(allocatable.get(GPU))
    product = _PRODUCT_SUFFIX.sub("", labels.get(PRODUCT, "")).replace("-", " ") or None
    count = _int(labels.get(COUNT))
    if config == "all-disabled":
        if migs:
            out.append(check("mig.allocatable", "fail", f"{node}: MIG devices allocatable ("
                             + ", ".join(f"{n} x {p}" for p, n in sorted(migs.items())) + ") under all-disabled",
                             "check mig.config.state and the device plugin pod on this node"))
        elif gpus:
            out.append(check("mig.allocatable", "pass", f"{gpus} whole GPU(s), no MIG devices"))
        else:
            out.append(check("mig.allocatable", "fail", f"{node}: no {GPU} allocatable",
                             "the device plugin pod on this node; the node layer"))
        return out
    expected = per_gpu(config, product)
    if strategy == "mixed":
        if expected and count:
            profile, n = expected
            want = count * n
            got = migs.get(profile, 0)
            others = {p: c for p, c in migs.items() if p != profile}
            if got == want and not others:
                out.append(check("mig.allocatable", "pass", f"{got} x {MIG_PREFIX}{profile} ({count} GPU(s) x {n})"))
            else:
                extra = f"; also {', '.join(f'{c} x {p}' for p, c in sorted(others.items()))}" if others else ""
                out.append(check("mig.allocatable", "fail", f"{node}: {got} x {MIG_PREFIX}{profile} allocatable, "
                                 f"{config} on {count} GPU(s) ({product}) yields {want}{extra}",
                                 "check mig.config.state, then the device plugin pod (it re-reads the devices after "
                                 "mig-manager); unhealthy devices are not allocatable (node layer)"))
        elif migs:
            out.append(check("mig.allocatable", "pass", ", ".join(f"{c} x {MIG_PREFIX}{p}" for p, c in
                                                                  sorted(migs.items()))
                             + ("" if count else " (no GFD labels: the count is not checked)")))
        else:
            out.append(check("mig.allocatable", "fail", f"{node}: no {MIG_PREFIX}* resources allocatable (mig.strategy "
                             f"mixed, layout {config})", "check mig.config.state and the device plugin pod"))
        return out
    # single strategy: the MIG devices are advertised as nvidia.com/gpu, all of one profile
    if migs:
        out.append(check("mig.allocatable", "fail", f"{node}: {MIG_PREFIX}* resources under mig.strategy {strategy}",
                         "the device plugin runs with another strategy than the site's mig.strategy: install again"))
    elif expected and count:
        profile, n = expected
        want = count * n
        suffix = labels.get(PRODUCT, "").endswith(f"-MIG-{profile}")
        if gpus == want and suffix:
            out.append(check("mig.allocatable", "pass", f"{gpus} x {GPU} ({profile} devices: {count} GPU(s) x {n})"))
        else:
            out.append(check("mig.allocatable", "fail", f"{node}: {gpus} x {GPU} allocatable ({PRODUCT}="
                             f"{labels.get(PRODUCT) or 'none'}), {config} on {count} GPU(s) yields {want} x {profile}",
                             "check mig.config.state, then the device plugin and GFD pods on this node"))
    elif gpus:
        out.append(check("mig.allocatable", "pass", f"{gpus} x {GPU}" + ("" if count else
                                                                          " (no GFD labels: the count is not checked)")))
    else:
        out.append(check("mig.allocatable", "fail", f"{node}: no {GPU} allocatable (layout {config})",
                         "check mig.config.state and the device plugin pod"))
    return out


def checks(assignments: Sequence[tuple[str, str]], strategy: str, nodes: Mapping[str, Any]) -> list[Check]:
    """MIG checks for every (node, config) assignment; nodes: name -> V1Node as the cluster layer listed them."""
    if not assignments:
        return [Check(LAYER, "mig.layout", CLUSTER, "skip", "no MIG layout configured (site mig.config, inventory "
                      "gpu_install_mig_config)")]
    out: list[Check] = []
    for name, config in assignments:
        obj = nodes.get(name)
        if obj is None:
            out.append(Check(LAYER, "mig.config-label", name, "skip", f"no Node {name} (cluster layer: node-present)"))
            continue
        labels = dict(obj.metadata.labels or {})
        alloc = dict(obj.status.allocatable or {}) if obj.status else {}
        out += node_checks(name, config, strategy, labels, alloc)
    return out
