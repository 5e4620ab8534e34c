"""examples/kuberay/ (issue 50): no Kubernetes runs here, so the manifests are checked by a dry parse. Each is YAML of
the kinds KubeRay and Kubernetes read, its pods take the bucket's credentials from the Secret and mount no shared
volume, every container runs the Ray version the `ray` extra pins, and every finetune command line in them parses
with finetune's own parser into the flags the page says (the worker submitting to the RayCluster's head service)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import yaml

from finetune.commands.cli import build_parser

FOLDER = Path(__file__).resolve().parents[2] / "examples" / "kuberay"
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
SECRET = "finetune-bucket"


def _documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((FOLDER / name).read_text()) if d]


def _pod_specs(document: dict) -> list[dict]:
    """Every pod template's spec in a RayCluster, a RayJob's cluster or a Deployment."""
    spec = document["spec"]
    if document["kind"] == "RayJob":
        spec = spec["rayClusterSpec"]
    if document["kind"] == "Deployment":
        return [spec["template"]["spec"]]
    return [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]


def _ray_pin() -> str:
    return re.search(r'ray = \["ray==([0-9.]+)"\]', PYPROJECT.read_text()).group(1)


def test_the_manifests_are_the_kinds_kuberay_reads():
    kinds = {name.name: [(d["apiVersion"], d["kind"]) for d in _documents(name.name)] for name in FOLDER.glob("*.yaml")}
    assert kinds == {
        "secret.yaml": [("v1", "Secret")],
        "raycluster.yaml": [("ray.io/v1", "RayCluster")],
        "rayjob.yaml": [("ray.io/v1", "RayJob")],
        "service.yaml": [("apps/v1", "Deployment"), ("apps/v1", "Deployment"), ("v1", "Service")],
    }
    secret = _documents("secret.yaml")[0]
    assert secret["metadata"]["name"] == SECRET
    assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION"} <= set(
        secret["stringData"]
    )


def test_every_pod_reads_the_bucket_from_the_secret_and_shares_no_volume():
    for name in ("raycluster.yaml", "rayjob.yaml", "service.yaml"):
        for document in _documents(name):
            if document["kind"] == "Service":
                continue
            if document["kind"] != "Deployment":
                assert document["spec"].get("rayVersion", document["spec"].get("rayClusterSpec", {}).get("rayVersion"))
            for pod in _pod_specs(document):
                for volume in pod.get("volumes", []):
                    assert "persistentVolumeClaim" not in volume and "nfs" not in volume, (name, volume)
                for container in pod["containers"]:
                    refs = [e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e]
                    assert refs == [SECRET], (name, container["name"])


def test_the_ray_version_is_the_extras_pin():
    pin = _ray_pin()
    assert _documents("raycluster.yaml")[0]["spec"]["rayVersion"] == pin
    assert _documents("rayjob.yaml")[0]["spec"]["rayClusterSpec"]["rayVersion"] == pin


def test_the_command_lines_parse_and_the_worker_submits_to_the_cluster():
    parser = build_parser()
    cluster = _documents("raycluster.yaml")[0]["metadata"]["name"]
    deployments = {d["metadata"]["name"]: d for d in _documents("service.yaml") if d["kind"] == "Deployment"}
    parsed = {}
    for name, document in deployments.items():
        container = document["spec"]["template"]["spec"]["containers"][0]
        parsed[name] = parser.parse_args(container["args"])
    assert parsed["finetune-api"].storage == parsed["finetune-worker"].storage
    assert parsed["finetune-worker"].storage.startswith("s3://")
    assert parsed["finetune-worker"].launcher == "ray"
    assert parsed["finetune-worker"].ray_address == f"{cluster}-head-svc:6379"  # KubeRay's name for the head service
    assert parsed["finetune-api"].workers == 0
    job = parser.parse_args(shlex.split(_documents("rayjob.yaml")[0]["spec"]["entrypoint"])[1:])
    assert job.launcher == "ray" and job.out.startswith("s3://") and job.data.startswith("s3://")
