"""Schema checks of rendered manifests, offline.

Kubernetes' own kinds are checked against the schemas ``kubernetes-validate`` ships (its strict
variant: an unknown field is an error, where the API server would drop it silently). Custom
resources (KEDA's ScaledObject and TriggerAuthentication, prometheus-operator's
ServiceMonitor) are not in those schemas: they are checked against the small schemas in
``crd_schemas/``, written for this kit from the CRDs' documentation and holding only the
fields it uses (strict as well, so a field added to the kit must be added there, checked
against the CRD). They take ``metadata`` and the HPA ``behavior`` from Kubernetes' schemas.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
from kubernetes_validate.utils import all_versions, latest_version, major_minor, schema_contents
from packaging.version import Version
from referencing import Registry, Resource

CRD_SCHEMAS = Path(__file__).resolve().parent / "crd_schemas"

#: The oldest Kubernetes the kit is for (native sidecar containers are on by default from
#: 1.29) and the newest whose schemas are installed.
VERSIONS = ("1.29", major_minor(latest_version()))


def validate(manifest: dict[str, Any], version: str) -> None:
    """Raise ``jsonschema.ValidationError`` if ``manifest`` does not fit its kind's schema
    (``kubernetes_validate.SchemaNotFoundError`` for a kind no schema knows)."""
    crd = _crd_schema(manifest["apiVersion"], manifest["kind"])
    if crd is None:
        kubernetes_validate.validate(manifest, version, strict=True)
        return
    registry: Registry[Any] = Registry().with_resource(
        _definitions_id(version), Resource.from_contents(_definitions(version))
    )
    jsonschema.Draft202012Validator(crd, registry=registry).validate(manifest)


def _crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    group, _, version = api_version.rpartition("/")
    if "." not in group:
        return None
    path = CRD_SCHEMAS / f"{kind.lower()}-{group.split('.')[0]}-{version}.json"
    if not path.exists():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@cache
def _definitions(version: str) -> dict[str, Any]:
    full = next(v for v in reversed(all_versions()) if Version(major_minor(v)) <= Version(version))
    loaded: dict[str, Any] = schema_contents(
        f"kubernetes-json-schema/v{full}-local-strict/_definitions.json", version
    )
    return loaded


def _definitions_id(version: str) -> str:
    return str(_definitions(version)["$id"])
