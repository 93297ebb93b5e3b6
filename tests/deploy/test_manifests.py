"""The Kubernetes kit (deploy/kubernetes): every overlay rendered offline and checked.

Each overlay must fit the Kubernetes schemas (and this kit's CRD schemas), set no environment
variable that no settings class of the process reads, and agree with the code where the two
meet: probe paths, the runner beside its director, the streams KEDA counts, references between
objects. Pure checks of files: no cluster, no network.
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from typing import Any
from unittest import mock
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from director.settings import DirectorSettings
from gateway.server import SERVICE
from gateway.settings import GatewaySettings
from protocol.paths import HEALTH_CHECK_PATH, HEALTH_PATH
from tests.deploy import settings_env
from tests.deploy.rendering import KIT, OVERLAYS, Manifest, identity, overlay, render
from tests.deploy.validation import VERSIONS, validate
from tests.deploy.workloads import (
    Container,
    containers,
    find,
    object_data,
    pod_labels,
    quantity,
    ref_of,
    selects,
    value_of,
)
from tracker.keys import Target

#: Secrets the kit names but production creates itself (../README.md says how).
EXTERNAL_SECRETS = {"conduit-backends", "conduit-keys"}
GPU = "nvidia.com/gpu"


@pytest.fixture(params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> list[Manifest]:
    return overlay(request.param)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail anything that tries to resolve a name or open a connection."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"network use during an offline check: {args!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


# Schemas


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_fits_its_schema(rendered: list[Manifest], version: str) -> None:
    for manifest in rendered:
        validate(manifest, version)


@pytest.mark.usefixtures("no_network")
def test_the_base_alone_fits_the_schemas() -> None:
    for manifest in render(KIT / "base"):
        validate(manifest, VERSIONS[0])


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [
        ("Deployment", ["spec", "template", "spec", "containers", 0, "livenesProbe"], {}),
        ("Deployment", ["spec", "template", "spec", "containers", 0, "ports", 0, "name"], 80),
        ("ScaledObject", ["spec", "triggers", 0, "metadata", "databaseIndex"], 0),
        ("ScaledObject", ["spec", "advanced", "scalingModifiers", "formla"], "x"),
        ("ServiceMonitor", ["spec", "endpoints", 0, "interval"], "30 seconds"),
        ("TriggerAuthentication", ["spec", "secretTargetRef", 0, "parameter"], None),
    ],
)
def test_the_schema_check_refuses_a_wrong_field(kind: str, path: list[Any], value: Any) -> None:
    manifest = copy.deepcopy(next(m for m in overlay("dev") if m["kind"] == kind))
    node = manifest
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        validate(manifest, VERSIONS[0])


# Environment variables against the settings classes


def unread_variables(manifests: list[Manifest]) -> list[str]:
    """Every variable a container sets that no settings class of its process reads."""
    problems = []
    for container in containers(manifests):
        if "envFrom" in container.spec:
            problems.append(f"{container.where}: envFrom hides the names it sets")
        known = settings_env.process_env_names(container.process)
        problems += [
            f"{container.where}: {var['name']} is read by no {container.process} settings"
            for var in container.spec.get("env", [])
            if var["name"] not in known
        ]
    return problems


def test_every_variable_is_read_by_a_settings_class(rendered: list[Manifest]) -> None:
    assert unread_variables(rendered) == []


def test_the_variable_check_refuses_a_name_nothing_reads() -> None:
    manifests = copy.deepcopy(overlay("dev"))
    director = next(c for c in containers(manifests) if c.process == "director")
    director.spec["env"].append({"name": "CONDUIT_DIRECTOR_NO_SUCH_SETTING", "value": "1"})
    director.spec["env"].append({"name": "CONDUIT_API_PAGE_SIZE", "value": "10"})  # api's
    problems = unread_variables(manifests)
    assert len(problems) == 2
    assert "CONDUIT_DIRECTOR_NO_SUCH_SETTING" in problems[0]
    assert "CONDUIT_API_PAGE_SIZE" in problems[1]


def settings_classes_of_every_process() -> Iterator[Any]:
    seen = set()
    for process in settings_env.PROCESS_PACKAGES:
        for settings in settings_env.process_classes(process):
            if settings not in seen:
                seen.add(settings)
                yield settings


def test_the_names_listed_for_a_settings_class_are_the_ones_it_reads() -> None:
    classes = list(settings_classes_of_every_process())
    assert {c.__name__ for c in classes} >= {"ApiSettings", "DirectorSettings", "RunnerConfig"}
    for settings in classes:
        for name in settings_env.env_names(settings):
            assert settings_env.reads(settings, name), f"{settings.__name__} ignores {name}"
    assert not settings_env.reads(DirectorSettings, "CONDUIT_DIRECTOR_NO_SUCH_SETTING")


def test_variables_read_outside_settings_classes_still_are() -> None:
    for name, path in settings_env.DIRECT_READS.items():
        assert f'"{name}"' in (settings_env.ROOT / path).read_text(), (
            f"{path} no longer reads {name}"
        )


def test_every_value_the_manifests_give_is_accepted(rendered: list[Manifest]) -> None:
    for container in containers(rendered):
        given = {var["name"]: value_of(rendered, var) for var in container.spec.get("env", [])}
        known = {name: value for name, value in given.items() if value is not None}
        for settings in settings_env.process_classes(container.process):
            names = settings_env.env_names(settings)
            wanted = {n: v for n, v in known.items() if n in names}
            with mock.patch.dict(os.environ, wanted, clear=True):
                settings()  # raises pydantic's ValidationError, naming the variable


# References between objects


def test_every_reference_names_something_that_exists(rendered: list[Manifest]) -> None:
    for container in containers(rendered):
        for var in container.spec.get("env", []):
            ref = ref_of(var)
            if ref is None:
                continue
            kind, key_ref = ref
            source = find(rendered, kind, key_ref["name"])
            if source is None:
                assert kind == "Secret" and key_ref["name"] in EXTERNAL_SECRETS, container.where
            elif not key_ref.get("optional"):
                assert key_ref["key"] in object_data(source), f"{container.where}: {var['name']}"
    for auth in (m for m in rendered if m["kind"] == "TriggerAuthentication"):
        for ref in auth["spec"]["secretTargetRef"]:
            secret = find(rendered, "Secret", ref["name"])
            assert secret is not None or ref["name"] in EXTERNAL_SECRETS
            assert secret is None or ref["key"] in object_data(secret)


def workloads_selected(rendered: list[Manifest], selector: dict[str, str]) -> list[Manifest]:
    return [
        m
        for m in rendered
        if m["kind"] in ("Deployment", "Job") and selects(selector, pod_labels(m))
    ]


def test_services_budgets_and_monitors_select_what_they_mean(rendered: list[Manifest]) -> None:
    services = [m for m in rendered if m["kind"] == "Service" and "selector" in m["spec"]]
    for service in services:
        [workload] = workloads_selected(rendered, service["spec"]["selector"])
        named = {c.spec["name"]: c for c in containers([workload])}
        for port in service["spec"]["ports"]:
            assert any(c.port(port["targetPort"]) for c in named.values()), identity(service)
    for budget in (m for m in rendered if m["kind"] == "PodDisruptionBudget"):
        selector = budget["spec"]["selector"]["matchLabels"]
        assert len(workloads_selected(rendered, selector)) == 1, identity(budget)
    for monitor in (m for m in rendered if m["kind"] == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        matched = [
            s
            for s in rendered
            if s["kind"] == "Service" and selects(selector, s["metadata"]["labels"])
        ]
        assert len(matched) == 1, identity(monitor)
        port_names = {p["name"] for p in matched[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names


def test_autoscaled_workloads_leave_the_replica_count_to_their_autoscaler(
    rendered: list[Manifest],
) -> None:
    scaled = [m for m in rendered if m["kind"] in ("HorizontalPodAutoscaler", "ScaledObject")]
    assert {m["kind"] for m in scaled} == {"HorizontalPodAutoscaler", "ScaledObject"}
    for autoscaler in scaled:
        target = find(rendered, "Deployment", autoscaler["spec"]["scaleTargetRef"]["name"])
        assert target is not None, identity(autoscaler)
        assert "replicas" not in target["spec"], f"{identity(target)} would fight its autoscaler"


# Pods


def test_every_long_running_process_has_split_probes(rendered: list[Manifest]) -> None:
    running = [c for c in containers(rendered) if c.long_running]
    assert {c.process for c in running} == {"api", "director", "gateway", "runner"}
    for container in running:
        liveness, readiness = container.spec["livenessProbe"], container.spec["readinessProbe"]
        assert liveness != readiness, container.where
        if container.process in ("api", "director"):
            # The split the processes are to serve: /livez (the loop runs) and /readyz
            # (the backends answer).
            assert liveness["httpGet"]["path"] == "/livez", container.where
            assert readiness["httpGet"]["path"] == "/readyz", container.where
            for probe in (liveness, readiness):
                assert container.port(probe["httpGet"]["port"]), container.where


def test_the_gateway_is_probed_over_grpc_health_on_its_own_port(rendered: list[Manifest]) -> None:
    gateways = [c for c in containers(rendered) if c.process == "gateway"]
    assert gateways
    for gateway in gateways:
        port = gateway.args.port
        assert gateway.args.host == "0.0.0.0" and gateway.port("grpc") == port
        # kubelet's gRPC probes call grpc.health.v1 at the container's port (by number: a
        # gRPC probe takes no port name).
        readiness = gateway.spec["readinessProbe"]["grpc"]
        liveness = gateway.spec["livenessProbe"]["grpc"]
        assert readiness["port"] == liveness["port"] == port, gateway.where
        assert readiness["service"] == SERVICE, gateway.where


def test_the_gateway_gets_time_to_finish_its_calls(rendered: list[Manifest]) -> None:
    for gateway in (c for c in containers(rendered) if c.process == "gateway"):
        set_grace = gateway.env("CONDUIT_GATEWAY_SHUTDOWN_GRACE")
        default = GatewaySettings.model_fields["shutdown_grace"].default
        grace = float(value_of(rendered, set_grace) or default) if set_grace else default
        pause = float(gateway.spec["lifecycle"]["preStop"]["exec"]["command"][-1])
        assert gateway.pod["terminationGracePeriodSeconds"] > pause + grace, gateway.where
        # Liveness fails only after longer than the grace, so it never cuts a stop short.
        liveness = gateway.spec["livenessProbe"]
        assert liveness["periodSeconds"] * liveness["failureThreshold"] > grace, gateway.where


def test_the_runner_is_probed_inside_its_container_on_its_own_paths(
    rendered: list[Manifest],
) -> None:
    for runner in (c for c in containers(rendered) if c.process == "runner"):
        base = f"http://127.0.0.1:{runner.args.port}"

        def command(probe: str, runner: Container = runner) -> str:
            return " ".join(runner.spec[probe]["exec"]["command"])

        assert f'"{base}{HEALTH_CHECK_PATH}"' in command("livenessProbe")
        for probe in ("readinessProbe", "startupProbe"):
            assert f'"{base}{HEALTH_PATH}"' in command(probe)


def test_every_container_has_bounded_resources(rendered: list[Manifest]) -> None:
    for container in containers(rendered):
        resources = container.spec["resources"]
        for name in ("cpu", "memory"):
            request = quantity(resources["requests"][name])
            limit = quantity(resources["limits"][name])
            assert 0 < request <= limit, f"{container.where}: {name}"


@pytest.mark.parametrize("name", [*OVERLAYS, "base"])
def test_only_production_asks_for_a_gpu_and_only_for_the_runner(name: str) -> None:
    manifests = render(KIT / "base") if name == "base" else overlay(name)
    asking = [
        c
        for c in containers(manifests)
        if GPU in c.spec["resources"].get("requests", {})
        or GPU in c.spec["resources"].get("limits", {})
    ]
    if name != "production":
        assert asking == []
        return
    [runner] = asking
    assert runner.process == "runner"
    assert runner.spec["resources"]["requests"][GPU] == runner.spec["resources"]["limits"][GPU] == 1
    tolerated = {t["key"] for t in runner.pod.get("tolerations", [])}
    assert GPU in tolerated


def test_pods_get_no_service_link_variables(rendered: list[Manifest]) -> None:
    # Kubernetes would add e.g. CONDUIT_DIRECTOR_METRICS_PORT=tcp://... for each Service, names
    # the settings classes' prefixes could read and the variable check above cannot see.
    for workload in (m for m in rendered if m["kind"] in ("Deployment", "Job")):
        assert workload["spec"]["template"]["spec"]["enableServiceLinks"] is False


def director_pods(rendered: list[Manifest]) -> Iterator[tuple[Container, Container]]:
    """(director, runner) of each pod that runs a director."""
    for director in (c for c in containers(rendered) if c.process == "director"):
        runners = [
            c
            for c in containers([director.workload])
            if c.process == "runner" and c.long_running and c.spec in director.pod["initContainers"]
        ]
        assert len(runners) == 1, f"{director.where}: one runner, as a native sidecar"
        yield director, runners[0]


def test_the_director_drives_the_runner_beside_it_over_loopback(rendered: list[Manifest]) -> None:
    pods = list(director_pods(rendered))
    assert pods
    for director, runner in pods:
        assert runner.args.host == "127.0.0.1", runner.where
        assert director.args.runner_url == f"http://127.0.0.1:{runner.args.port}"
        assert director.args.concurrency == runner.args.concurrency
        token = director.env("CONDUIT_RUNNER_TOKEN")
        assert token is not None and token == runner.env("CONDUIT_RUNNER_TOKEN")
        assert "value" not in token, "the runner token comes from a Secret"
        # One consumer name per pod: a fixed one would be shared by every replica.
        assert director.env("CONDUIT_DIRECTOR_ID") is None
        receiver = director.port("receiver")
        assert value_of(rendered, director.env("CONDUIT_DIRECTOR_RECEIVER_PORT") or {}) == str(
            receiver
        )
        url = value_of(rendered, director.env("CONDUIT_DIRECTOR_RECEIVER_URL") or {})
        assert url == f"http://127.0.0.1:{receiver}"


def test_directors_get_time_to_finish_before_they_are_killed(rendered: list[Manifest]) -> None:
    for director, _ in director_pods(rendered):
        set_grace = director.env("CONDUIT_DIRECTOR_SHUTDOWN_GRACE")
        default = DirectorSettings.model_fields["shutdown_grace"].default
        grace = float(value_of(rendered, set_grace) or default) if set_grace else default
        assert director.pod["terminationGracePeriodSeconds"] > grace


# Autoscaling on the queue


def scaled_object_of(rendered: list[Manifest], workload: Manifest) -> Manifest:
    [scaled] = [
        m
        for m in rendered
        if m["kind"] == "ScaledObject"
        and m["spec"]["scaleTargetRef"]["name"] == workload["metadata"]["name"]
    ]
    return scaled


def test_keda_counts_every_shard_of_the_directors_deployment(rendered: list[Manifest]) -> None:
    backends = find(rendered, "Secret", "conduit-backends")
    for director, _ in director_pods(rendered):
        spec = scaled_object_of(rendered, director.workload)["spec"]
        triggers = spec["triggers"]
        assert {t["type"] for t in triggers} == {"redis-streams"}
        streams = [t["metadata"]["stream"] for t in triggers]
        assert streams == Target.deployment(director.args.deployment, len(triggers)).all_streams()
        # No consumerGroup: KEDA then reads XLEN, which counts running entries too (they are
        # deleted when acknowledged); with a group it would read the PEL or the lag instead.
        assert all("consumerGroup" not in t["metadata"] for t in triggers)
        modifiers = spec["advanced"]["scalingModifiers"]
        assert modifiers["formula"] == " + ".join(t["name"] for t in triggers)
        assert modifiers["target"] == str(director.args.concurrency)
        for trigger in triggers:
            assert find(rendered, "TriggerAuthentication", trigger["authenticationRef"]["name"])
            if backends is not None:
                database = urlsplit(object_data(backends)["redis-url"]).path.strip("/") or "0"
                assert trigger["metadata"]["databaseIndex"] == database


def test_backend_urls_name_the_external_services() -> None:
    manifests = overlay("dev")
    secrets = object_data(find(manifests, "Secret", "conduit-backends") or {})
    for key in ("database-url", "redis-url"):
        host = urlsplit(secrets[key]).hostname or ""
        service = find(manifests, "Service", host)
        assert service is not None and service["spec"]["type"] == "ExternalName", key
    redis = urlsplit(secrets["redis-url"])
    external = find(manifests, "Service", redis.hostname or "") or {}
    # KEDA resolves names in its own namespace: it gets the external name itself.
    assert secrets["redis-address"] == f"{external['spec']['externalName']}:{redis.port or 6379}"


# The real kustomize, where it is installed


@pytest.mark.parametrize("name", OVERLAYS)
def test_kubectl_kustomize_renders_the_same(name: str) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the offline rendering stands alone")
    output = subprocess.run(
        [kubectl, "kustomize", str(KIT / "overlays" / name)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    theirs = {identity(m): m for m in yaml.safe_load_all(output) if m}
    ours = {identity(m): m for m in overlay(name)}
    assert theirs == ours
