"""Every YAML file under config/ parses, and every Kubernetes object in them
is one the API server would accept: built-in kinds against the Kubernetes
OpenAPI schemas (kubernetes-validate), our CRD kinds as `epp validate` checks
them, EPP configuration files with the EPP's own loader. Files that are no
Kubernetes manifests (Envoy bootstrap templates, simulator scenarios) only
have to parse. The deployment's ConfigMaps must equal their sources."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from epp.api import crds
from epp.api.validation import check
from epp.config.loader import is_config, parse_config
from epp.demo.envoy_config import EnvoyTarget, envoy_config

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "config"
KUBERNETES_VERSION = "1.33"
SIDECAR_ENVOY = {
    "LISTEN_ADDRESS": "0.0.0.0",
    "LISTEN_PORT": "8081",
    "ADMIN_ADDRESS": "127.0.0.1",
    "ADMIN_PORT": "9901",
    "EPP_ADDRESS": "127.0.0.1",
    "EPP_PORT": "9002",
    "EPP_CLUSTER_TYPE": "STATIC",
}


def text(path: Path) -> str:
    """A file's YAML; a template (with `${...}` placeholders, as Envoy's) is
    rendered with the sidecar's values first."""
    raw = path.read_text(encoding="utf-8")
    return string.Template(raw).substitute(SIDECAR_ENVOY) if "${" in raw else raw


FILES = sorted(p for p in CONFIG.rglob("*") if p.suffix in (".yaml", ".yml"))
DOCUMENTS = [
    pytest.param(document, id=f"{path.relative_to(CONFIG)}[{index}]")
    for path in FILES
    for index, document in enumerate(yaml.safe_load_all(text(path)))
    if isinstance(document, dict) and "apiVersion" in document and "kind" in document
]


def data(path: str, key: str) -> str:
    return yaml.safe_load((CONFIG / path).read_text(encoding="utf-8"))["data"][key]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(CONFIG)))
def test_every_yaml_file_under_config_parses(path: Path):
    assert list(yaml.safe_load_all(text(path)))


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_object_is_valid_for_its_kind(document: dict[str, Any]):
    if crds.lookup(document["apiVersion"], document["kind"]) is not None:
        checked = check(document)
        assert checked.valid, "; ".join(map(str, checked.errors))
    elif is_config(document):
        parse_config(document)
    else:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_an_invalid_built_in_object_is_caught():
    service = yaml.safe_load((CONFIG / "deploy" / "service.yaml").read_text(encoding="utf-8"))
    service["spec"]["ports"][0]["port"] = "eighty"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES_VERSION, strict=True)


def test_the_manifests_cover_rbac_deployment_service_and_config_maps():
    objects = [param.values[0] for param in DOCUMENTS]
    kinds = {(obj["kind"], (obj.get("metadata") or {}).get("name")) for obj in objects}
    for kind in ("ServiceAccount", "Role", "RoleBinding", "Deployment", "Service"):
        assert (kind, "vllm-llama3-8b-epp") in kinds
    assert ("ConfigMap", "vllm-llama3-8b-envoy") in kinds
    assert ("ConfigMap", "vllm-llama3-8b-epp-config") in kinds


def test_the_sidecar_envoy_config_is_what_epp_envoy_config_writes():
    sidecar = EnvoyTarget(listen="0.0.0.0:8081", admin="127.0.0.1:9901", epp="127.0.0.1:9002")
    assert data("deploy/envoy-configmap.yaml", "envoy.yaml") == envoy_config(sidecar), (
        "re-render config/deploy/envoy-configmap.yaml with epp envoy-config --listen 0.0.0.0:8081"
    )


def test_the_epp_config_map_holds_the_default_configuration():
    default = (CONFIG / "epp" / "default.yaml").read_text(encoding="utf-8")
    assert data("deploy/epp-configmap.yaml", "config.yaml") == default
