"""The manifests' memory limit and request timeout follow the measured long-document figures
(benchmarks/results/memory_one_mib.json, `python -m benchmarks.memory_one_mib`): a document the server
accepts must neither get the pod OOM-killed nor be refused with 504 after the first one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from deploy_helpers import ROOT, deployment_container, k8s_objects, kserve_container

MEASURED = json.loads((ROOT / "benchmarks" / "results" / "memory_one_mib.json").read_text())
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
ARENA_MIB = 65536 * 7.3 / 1024  # another text model's onnxruntime arena after a 64K-token batch (7.3 KB/token)
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
    needed = (server["peak_rss_mib"] + ARENA_MIB) * HEADROOM
    assert mib(container["resources"]["limits"]["memory"]) >= needed
    assert server["rss_after_long_mib"] < 2 * server["rss_idle_mib"]  # returned after the document


@pytest.mark.parametrize("which", ["k8s", "kserve"])
def test_request_timeout_admits_a_max_length_document(which: str) -> None:
    container = deployment_container() if which == "k8s" else kserve_container()
    timeout = float(env_of(container, which).get("LARA_REQUEST_TIMEOUT_S") or 30.0)
    assert timeout >= 2 * MEASURED["variants"]["server"]["long_seconds"]  # a busier node is slower
