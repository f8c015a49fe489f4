"""The live shell's eyes on the pool: which endpoints there are and how loaded they are.

| module      | owns                                                                 |
|-------------|----------------------------------------------------------------------|
| `store`     | the endpoints and their latest metrics; immutable snapshots          |
| `endpoints` | where endpoints come from: pods, a static list, an endpoints document |
| `engines`   | the one table of each engine's series (with where the engine defines |
|             | them), its metrics path, and which engine an endpoint runs           |
| `reader`    | one metrics page -> `EndpointMetrics` (sum over ranks, once over     |
|             | copies, idle when an engine's page lacks load series; the inter-     |
|             | token latency histogram's sum, count and buckets, added over label  |
|             | sets)                                                                |
| `scraper`   | reading every endpoint's page over HTTP(S) into the store            |
|             | (`MetricsSource`: scheme, path, port, TLS; limits per read)          |
| `fetch`     | one endpoint's GET over a kept-alive connection (httptools)          |
| `polling`   | one task per endpoint for what reads each server on its own period   |
| `models`    | every endpoint's model list (`GET /v1/models`), for models-responder |
| `kvevents`  | the servers' KV-cache events over ZMQ, into the precise prefix index |

Invariants: only the store holds metrics; the reader does no I/O; a failed
read marks an endpoint stale at once and never removes it. Cost: a read
picks its few lines out of the page by substring search and parses only
those (a line whose value changed only, such as a bucket, reuses the parse
of its name and labels; a page whose lines all read as before is not
parsed again); a snapshot is rebuilt only on the first read after a
change.
"""
