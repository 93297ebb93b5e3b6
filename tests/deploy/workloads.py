"""Reading rendered manifests: pods, their containers, what each runs and with which values."""

from __future__ import annotations

import argparse
import base64
import re
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from conduit.cli import build_parser
from tests.deploy.rendering import Manifest, identity

WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "Job")

#: Kubernetes' quantity syntax (the pattern of its OpenAPI definition).
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$")
_SUFFIXES: dict[str, Decimal] = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
}


@dataclass(frozen=True)
class Container:
    """One container of a rendered pod, with what it runs."""

    workload: Manifest
    pod: dict[str, Any]
    spec: dict[str, Any]
    #: Started with the pod and kept running: an app container or a native sidecar.
    long_running: bool

    @property
    def where(self) -> str:
        kind, name = identity(self.workload)
        return f"{kind}/{name} container {self.spec['name']}"

    @property
    def args(self) -> argparse.Namespace:
        """The ``conduit`` command line, parsed by the CLI's own parser (the image's
        entrypoint is ``conduit``; a container that replaces it is not understood here)."""
        assert "command" not in self.spec, f"{self.where}: replaces the conduit entrypoint"
        return build_parser().parse_args([str(arg) for arg in self.spec["args"]])

    @property
    def process(self) -> str:
        return str(self.args.command)

    def env(self, name: str) -> dict[str, Any] | None:
        return next((var for var in self.spec.get("env", []) if var["name"] == name), None)

    def port(self, name: str) -> int | None:
        ports = self.spec.get("ports", [])
        return next((int(p["containerPort"]) for p in ports if p.get("name") == name), None)


def containers(manifests: list[Manifest]) -> Iterator[Container]:
    for workload in manifests:
        if workload["kind"] not in WORKLOADS:
            continue
        pod = workload["spec"]["template"]["spec"]
        service = workload["kind"] != "Job"
        for spec in pod.get("initContainers", []):
            yield Container(workload, pod, spec, service and spec.get("restartPolicy") == "Always")
        for spec in pod["containers"]:
            yield Container(workload, pod, spec, service)


def pod_labels(workload: Manifest) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def find(manifests: list[Manifest], kind: str, name: str) -> Manifest | None:
    return next((m for m in manifests if identity(m) == (kind, name)), None)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def object_data(manifest: Manifest) -> dict[str, str]:
    """A rendered ConfigMap's or Secret's keys and values (Secret ``data`` decoded)."""
    data: dict[str, str] = dict(manifest.get("stringData", {}))
    for key, value in manifest.get("data", {}).items():
        decoded = base64.b64decode(value).decode() if manifest["kind"] == "Secret" else value
        data[key] = decoded
    return data


def ref_of(var: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """(kind, the ``*KeyRef``) of a variable taken from a Secret or ConfigMap."""
    source = var.get("valueFrom", {})
    for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
        if field in source:
            return kind, source[field]
    return None


def value_of(manifests: list[Manifest], var: dict[str, Any]) -> str | None:
    """The variable's value when the manifests say it: literal, or a key of a rendered
    Secret or ConfigMap. None when it comes from elsewhere (a Secret made outside git)."""
    if "value" in var:
        return str(var["value"])
    ref = ref_of(var)
    if ref is None:
        return None
    kind, key_ref = ref
    source = find(manifests, kind, key_ref["name"])
    return None if source is None else object_data(source).get(key_ref["key"])


def quantity(text: str | int) -> Decimal:
    match = _QUANTITY.match(str(text))
    assert match and match.group(2) in _SUFFIXES, f"not a quantity this check knows: {text!r}"
    return Decimal(match.group(1)) * _SUFFIXES[match.group(2)]
