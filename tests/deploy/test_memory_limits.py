"""The manifests' memory limit and request timeout follow the measured long-document figures
(benchmarks/results/memory_one_mib.json, `python -m benchmarks.memory_one_mib --variants server`): a document the server
accepts must neither get the pod OOM-killed nor be refused with 504 after the first one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from deploy_helpers import ROOT, deployment_container, k8s_objects, kserve_container

from benchmarks.memory_one_mib import image_models

MEASURED = json.loads((ROOT / "benchmarks" / "results" / "memory_one_mib.json").read_text())
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
HEADROOM = 1.10


def mib(quantity: str) -> float:
    return int(quantity[:-2]) * UNITS[quantity[-2:]] / 2**20


def env_of(container: dict[str, Any], which: str) -> dict[str, str]:
    config = k8s_objects()["ConfigMap"]["data"] if which == "k8s" else {}  # the Deployment reads it envFrom
    return {**config, **{e["name"]: e.get("value") for e in container.get("env", []) if "value" in e}}


@pytest.mark.parametrize("which", ["k8s", "kserve"])
def test_memory_limit_holds_one_max_length_document(which: str) -> None:
    container = deployment_container() if which == "k8s" else kserve_container()
    server = MEASURED["variants"]["server"]
    assert MEASURED["bytes"] == 1 << 20  # the shipped text models' max_length
    # measured with the models the image serves, each text model given the 1 MiB document
    assert server["models"] == list(image_models())
    texts = [name for name, config in image_models().items() if config["task"] == "text"]
    assert sorted(server["per_model"]) == sorted(texts) and "lara-text-news" in texts
    # The peak was measured with the arenas already at their largest (each text model's largest batch, in the
    # one arena the models share: about the largest of them, ~480 MiB; the sum, one arena each, ~860 MiB).
    assert server["rss_arenas_mib"] > server["rss_idle_mib"] + 400
    own = MEASURED["variants"]["server_own_arenas"]
    assert own["rss_arenas_mib"] > own["rss_idle_mib"] + 800 and own["models"] == server["models"]
    limit = mib(container["resources"]["limits"]["memory"])
    assert limit >= server["peak_rss_mib"] * HEADROOM
    assert limit <= 2048  # the 2 GiB pod of issue 49, now that long documents run on the sliced program
    assert server["rss_after_long_mib"] < server["rss_arenas_mib"] + 64  # the document's memory returned


@pytest.mark.parametrize("which", ["k8s", "kserve"])
def test_request_timeout_admits_a_max_length_document(which: str) -> None:
    container = deployment_container() if which == "k8s" else kserve_container()
    timeout = float(env_of(container, which).get("LARA_REQUEST_TIMEOUT_S") or 30.0)
    assert timeout >= 2 * MEASURED["variants"]["server"]["long_seconds"]  # a busier node is slower
