"""`epp envoy-config`'s output: config/envoy/envoy.yaml filled in, nothing left to fill."""

from __future__ import annotations

import yaml

from epp.cli import main


def written(capsys, *argv: str) -> dict:
    assert main(["envoy-config", *argv]) == 0
    text = capsys.readouterr().out
    assert "${" not in text
    return yaml.safe_load(text)


def epp_cluster(config: dict) -> dict:
    return next(c for c in config["static_resources"]["clusters"] if c["name"] == "epp")


def epp_address(config: dict) -> dict:
    endpoint = epp_cluster(config)["load_assignment"]["endpoints"][0]["lb_endpoints"][0]
    return endpoint["endpoint"]["address"]["socket_address"]


def listener_address(config: dict) -> dict:
    return config["static_resources"]["listeners"][0]["address"]["socket_address"]


def test_by_default_envoy_listens_on_loopback_8081_for_a_tls_epp_on_9002(capsys):
    config = written(capsys)
    assert listener_address(config) == {"address": "127.0.0.1", "port_value": 8081}
    assert epp_address(config) == {"address": "127.0.0.1", "port_value": 9002}
    assert epp_cluster(config)["type"] == "STATIC"
    assert "transport_socket" in epp_cluster(config)


def test_a_pool_is_reached_at_its_epp_service_by_dns(capsys):
    config = written(capsys, "--pool=vllm-llama3-8b", "--namespace=inference")
    assert epp_address(config) == {
        "address": "vllm-llama3-8b-epp.inference.svc.cluster.local",
        "port_value": 9002,
    }
    assert epp_cluster(config)["type"] == "STRICT_DNS"
    assert listener_address(config) == {"address": "0.0.0.0", "port_value": 8081}


def test_plaintext_drops_the_tls_socket_only(capsys):
    tls, plain = written(capsys), written(capsys, "--plaintext")
    assert "transport_socket" not in epp_cluster(plain)
    del epp_cluster(tls)["transport_socket"]
    assert plain == tls


def test_an_address_that_is_no_host_and_port_is_refused_by_name(capsys):
    assert main(["envoy-config", "--epp=under_score:9002"]) == 2
    assert "'under_score' is neither an IP address nor a DNS name" in capsys.readouterr().err
