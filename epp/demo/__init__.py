"""The live demo: simulated model servers over HTTP, a load generator,
a real Envoy and `epp serve`, all on loopback.

| module           | owns                                                          |
|------------------|---------------------------------------------------------------|
| `command`        | `epp demo`: arguments, the run, the printed report            |
| `demo`           | one run: the stack up, the load, the watch, the report        |
| `compare`        | `epp demo --compare`: one run per policy, side by side        |
| `up`             | `epp up`: the stack kept up until Ctrl-C                      |
| `stack`          | starting and stopping the parts (servers, EPP, Envoy)         |
| `processes`      | child processes: ready files, always stopped                  |
| `envoy_config`   | `epp envoy-config`: envoy.yaml for file or cluster mode       |
| `envoy_process`  | one real Envoy: its config, free ports, readiness             |
| `model_server`   | a simulated model server over HTTP on the simulator's model   |
| `model_servers`  | several in one process: the command line, `serving_on`        |
| `realtime_model` | the simulator's model server played on the event loop's clock |
| `server_formats` | the OpenAI bodies it reads and writes, as vLLM does           |
| `server_metrics` | its metrics pages, posing as vLLM, SGLang or trtllm-serve     |
| `kv_publisher`   | its KV-cache events over ZMQ, as vLLM publishes them          |
| `tokenizer_file` | a trained tokenizer.json the servers and the EPP both load    |
| `sidecar`        | the P/D routing sidecar in front of a decode server           |
| `loadgen`        | the scenario's tenants played through Envoy                   |
| `loadwatch`      | what the EPP saw of the servers' load, and how late           |
| `report`         | the numbers in the shape of `epp simulate`'s report           |
"""
