"""A deployment's KEDA ScaledObject, rendered from what the API stores about it.

``min_instances`` and ``max_instances`` (``POST``/``PATCH /v1/deployments``) bound the
directors the Kubernetes kit runs for the deployment: ``conduit admin scaler OWNER/NAME``
prints the ScaledObject that says so, for ``kubectl apply -f -``, after each release. Its
triggers count the deployment's streams and those of the version it runs (predictions sent to
the version or the model wait there), summed by the formula, at ``concurrency`` entries per
director (``XLEN``: what waits plus what runs; see deploy/kubernetes/README.md). With
``min_instances`` 0 the directors scale to zero while all those streams are empty.
"""

from __future__ import annotations

import re
from typing import Any

from catalog.records import DeploymentInfo
from tracker.keys import Target


def resource_name(deployment: DeploymentInfo) -> str:
    """``conduit-director-<owner>-<name>``, as a DNS-1123 name (at most 63 characters)."""
    raw = f"conduit-director-{deployment.owner}-{deployment.name}".lower()
    return re.sub(r"[^a-z0-9-]+", "-", raw)[:63].rstrip("-")


def scaled_object(
    deployment: DeploymentInfo,
    version_shards: int,
    *,
    target: str = "conduit-director",
    concurrency: int = 4,
    authentication: str = "conduit-redis",
) -> dict[str, Any]:
    """The ScaledObject scaling the Deployment ``target`` (its directors) for ``deployment``."""
    streams = [
        *Target.deployment(deployment.full_name, deployment.shards).all_streams(),
        *Target.version(deployment.version_id, version_shards).all_streams(),
    ]
    triggers = [
        {
            "type": "redis-streams",
            "name": f"stream{index}",
            "metadata": {
                "stream": stream,
                "streamLength": str(concurrency),
                "databaseIndex": "0",
            },
            "authenticationRef": {"name": authentication},
        }
        for index, stream in enumerate(streams)
    ]
    labels = {
        "app.kubernetes.io/name": "conduit",
        "app.kubernetes.io/component": "director",
        "conduit.dev/deployment": f"{deployment.owner}.{deployment.name}",
        "conduit.dev/release": str(deployment.release_number),
    }
    if deployment.hardware is not None:
        labels["conduit.dev/hardware"] = deployment.hardware
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": resource_name(deployment), "labels": labels},
        "spec": {
            "scaleTargetRef": {"name": target},
            "pollingInterval": 5,
            "cooldownPeriod": 300,
            "minReplicaCount": deployment.min_instances,
            "maxReplicaCount": deployment.max_instances,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {
                        "scaleDown": {
                            "stabilizationWindowSeconds": 300,
                            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
                        }
                    }
                },
                "scalingModifiers": {
                    "formula": " + ".join(f"stream{i}" for i in range(len(streams))),
                    "target": str(concurrency),
                    "metricType": "AverageValue",
                },
            },
            "triggers": triggers,
        },
    }
