"""Deployment files (docs/router.md, "Deployment"): the Kubernetes
manifests in deploy/k8s validated against the Kubernetes OpenAPI schemas by
kubernetes-validate (strict: unknown fields fail; offline, the schemas ship
in the package), the router config in their ConfigMap checked by `ingot
route --check`, and the Dockerfile linted by hadolint. Each check skips
only when its tool is not installed (scripts/python-env installs both), and
fails then under CI=true."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from ingot_e2e import BIN, require

REPO = Path(__file__).resolve().parents[2]
K8S = sorted((REPO / "deploy" / "k8s").glob("*.yaml"))
KUBE_VERSION = "1.37.0"


def _tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    require(found, f"{name} is not installed (scripts/python-env installs it)")
    return found


def _docs() -> list[dict]:
    return [d for f in K8S for d in yaml.safe_load_all(f.read_text()) if d]


def test_manifests_validate_against_the_kubernetes_schemas():
    assert K8S, "no manifests in deploy/k8s"
    tool = _tool("kubernetes-validate")
    r = subprocess.run([tool, "--strict", "--no-warn", "-k", KUBE_VERSION, *map(str, K8S)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("passed") == len(_docs()), r.stdout


def test_the_validator_rejects_a_broken_manifest(tmp_path):
    """The check can fail: a misspelt field in a copy of the worker manifest."""
    tool = _tool("kubernetes-validate")
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "deploy" / "k8s" / "workers.yaml").read_text()
                   .replace("readinessProbe:", "readinesProbe:", 1))
    r = subprocess.run([tool, "--strict", "-k", KUBE_VERSION, str(bad)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "readinesProbe" in r.stdout + r.stderr, r.stdout + r.stderr


def test_workers_have_a_gpu_probes_drain_and_a_headless_service():
    docs = {(d["kind"], d["metadata"]["name"]): d for d in _docs()}
    pod = docs[("Deployment", "ingot-worker")]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert c["lifecycle"]["preStop"]
    assert pod["terminationGracePeriodSeconds"] > c["lifecycle"]["preStop"]["sleep"]["seconds"]
    svc = docs[("Service", "ingot-workers")]["spec"]
    assert svc["clusterIP"] == "None"
    router = docs[("ConfigMap", "ingot-router")]["data"]["router.toml"]
    assert f'"ingot-workers.default.svc.cluster.local:{svc["ports"][0]["port"]}"' in router


def test_the_configmap_router_config_is_accepted_by_ingot_route(tmp_path):
    cm = next(d for d in _docs() if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "ingot-router")
    cfg = tmp_path / "router.toml"
    cfg.write_text(cm["data"]["router.toml"])
    r = subprocess.run([str(BIN), "route", "--config", str(cfg), "--check"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_dockerfile_passes_hadolint():
    tool = _tool("hadolint")
    dockerfile = REPO / "Dockerfile"
    r = subprocess.run([tool, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    text = dockerfile.read_text()
    # Multi-stage: the runtime stage copies only the binary from the builder.
    assert text.count("\nFROM ") >= 2 and "COPY --from=builder /out/ingot" in text
