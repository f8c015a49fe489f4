"""File mode: the pool, the objectives and the endpoints from files
(`--pool`, `--objectives`, `--endpoints`), each reloaded when it changes.

The counterpart of the cluster mode (`epp.k8s.cluster`): both hold the pool
and the `ObjectiveRegistry` the server resolves priorities with. Without
`--objectives` the objectives shipped with the package are read; without
`--pool`, the pool `initial_pool` gives. A reload that raises keeps the last
good state (`epp.serve.filewatch`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

from epp import defaults
from epp.api.manifests import load_objectives, load_pool
from epp.api.registry import ObjectiveRegistry
from epp.config.datalayer import DataLayerConfig, FileDiscovery
from epp.datalayer.store import EndpointStore
from epp.serve.filewatch import FileWatcher
from epp.serve.inputs import StartupError, initial_pool, read_endpoints
from epp.serve.options import ServeOptions

log = logging.getLogger("epp.serve.server")


class FileMode:
    """The file-mode inputs of one live EPP, loaded at construction."""

    def __init__(
        self,
        options: ServeOptions,
        store: EndpointStore,
        publish: Callable[[Iterable[int]], None],
    ) -> None:
        if options.endpoints is None:
            raise StartupError(
                "no endpoints: give --endpoints ip:port,... (or @FILE), or --pool-name "
                "(or --endpoint-selector with --endpoint-target-ports) without --endpoints "
                "to take the pods from Kubernetes"
            )
        self._options = options
        self._store = store
        self._paths: tuple[str | Path, ...] = options.objectives or (defaults.OBJECTIVES,)
        self.pool = initial_pool(options)
        self.registry = ObjectiveRegistry(self.pool, publish=publish)
        self._objectives = load_objectives(self._paths)
        self.registry.replace(self._objectives)
        store.replace_all(read_endpoints(options.endpoints))
        log.info(
            "pool %s/%s: %d objectives apply (priorities %s), %d endpoints",
            self.pool.namespace,
            self.pool.name,
            len(self.registry.objectives()),
            sorted(self.registry.priorities),
            len(store),
        )

    def reload_objectives(self) -> None:
        objectives = load_objectives(self._paths)
        self.registry.replace(objectives)
        self._objectives = objectives

    def reload_pool(self) -> None:
        assert self._options.pool_file is not None
        pool = load_pool(self._options.pool_file)
        self.registry.set_pool(pool)
        self.registry.replace(self._objectives)
        self.pool = pool

    def reload_endpoints(self) -> None:
        assert self._options.endpoints is not None
        self._store.replace_all(read_endpoints(self._options.endpoints))

    def watch(self, watcher: FileWatcher, data_layer: DataLayerConfig) -> None:
        """Register the given files with `watcher`; an endpoints file the
        data layer's file discovery says not to watch is not watched."""
        options = self._options
        if options.objectives:
            watcher.watch("the objectives", options.objectives, self.reload_objectives)
        if options.pool_file is not None:
            watcher.watch("the pool", [options.pool_file], self.reload_pool)
        discovery = data_layer.discovery
        unwatched = (
            discovery is not None
            and isinstance(discovery[1], FileDiscovery)
            and not discovery[1].watch_file
        )
        if options.endpoints is not None and options.endpoints.startswith("@") and not unwatched:
            watcher.watch("the endpoints", [options.endpoints[1:]], self.reload_endpoints)
