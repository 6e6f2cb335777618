"""Reads deploy/ (the Kubernetes manifests and the image recipe) and prints what deploy_test.cc
checks against a running k3 serve, as JSON: the replicas' probes, port, arguments, grace period,
preStop hook and memory; the InferencePool; the endpoint picker's arguments and configuration;
the Dockerfile's base, install step and entrypoint. A manifest that does not parse, or lacks a
part, exits 1 naming the file and the part.

usage: deploy_manifests.py REPO_ROOT
"""
import json
import re
import sys
from pathlib import Path

import yaml


def fail(message):
    print(f"deploy_manifests.py: {message}", file=sys.stderr)
    sys.exit(1)


def documents(path):
    try:
        with open(path) as f:
            return {d["kind"]: d for d in yaml.safe_load_all(f) if d}
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        fail(f"{path}: {e}")


def part(docs, kind, path):
    if kind not in docs:
        fail(f"{path}: no {kind}")
    return docs[kind]


def probe(container, name):
    p = container.get(name)
    if not p or "httpGet" not in p:
        fail(f"the k3 container has no {name} with httpGet")
    return {"path": p["httpGet"]["path"], "port": p["httpGet"]["port"]}


def replicas(path):
    docs = documents(path)
    deployment = part(docs, "Deployment", path)
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    resources = container.get("resources", {})
    return {
        "pod_labels": pod["metadata"]["labels"],
        "args": container["args"],
        "ports": ports,
        "startup": probe(container, "startupProbe"),
        "readiness": probe(container, "readinessProbe"),
        "liveness": probe(container, "livenessProbe"),
        "grace_seconds": pod["spec"]["terminationGracePeriodSeconds"],
        "pre_stop": " ".join(container["lifecycle"]["preStop"]["exec"]["command"]),
        "memory_request": resources.get("requests", {}).get("memory", ""),
        "memory_limit": resources.get("limits", {}).get("memory", ""),
        "service_selector": part(docs, "Service", path)["spec"]["selector"],
    }


def gateway(path):
    docs = documents(path)
    pool = part(docs, "InferencePool", path)
    epp = part(docs, "Deployment", path)["spec"]["template"]["spec"]["containers"][0]
    config_map = part(docs, "ConfigMap", path)["data"]
    config = {name: yaml.safe_load(text) for name, text in config_map.items()}
    route = part(docs, "HTTPRoute", path)
    return {
        "pool_api_version": pool["apiVersion"],
        "pool_name": pool["metadata"]["name"],
        "pool_selector": pool["spec"]["selector"]["matchLabels"],
        "pool_ports": [p["number"] for p in pool["spec"]["targetPorts"]],
        "picker": pool["spec"]["endpointPickerRef"],
        "picker_service": part(docs, "Service", path)["metadata"]["name"],
        "picker_service_ports": [p["port"] for p in part(docs, "Service", path)["spec"]["ports"]],
        "picker_args": epp["args"],
        "picker_config": config,
        "route_backends": [b for r in route["spec"]["rules"] for b in r["backendRefs"]],
    }


def dockerfile(path):
    try:
        text = Path(path).read_text()
    except OSError as e:
        fail(f"{path}: {e}")
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.strip().startswith("#")]
    base = [l.split()[1] for l in lines if l.startswith("FROM ")]
    entry = [json.loads(l[len("ENTRYPOINT "):]) for l in lines if l.startswith("ENTRYPOINT ")]
    if not base or not entry:
        fail(f"{path}: no FROM or no ENTRYPOINT")
    return {
        "base": base[0],
        "installs_with_setup_deps_run": bool(re.search(r"scripts/setup-deps\.sh run\b", text)),
        "builds_release": "-DCMAKE_BUILD_TYPE=Release" in text,
        "entrypoint": entry[-1],
    }


def main():
    if len(sys.argv) != 2:
        fail("usage: deploy_manifests.py REPO_ROOT")
    root = Path(sys.argv[1])
    print(json.dumps({
        "replicas": replicas(root / "deploy/k8s/k3-serve.yaml"),
        "gateway": gateway(root / "deploy/k8s/gateway.yaml"),
        "image": dockerfile(root / "deploy/Dockerfile"),
    }))


if __name__ == "__main__":
    main()
