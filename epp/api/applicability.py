"""Whether an InferenceObjective applies to an InferencePool.

An objective applies when it is in the pool's namespace and either one of its
pool references names the pool (name, group and kind all equal) or its pool
selector matches the pool's labels. References and selector are a union, as in
the reference Router's multi-pool objectives.
"""

from __future__ import annotations

from epp.api.models import POOL_GROUP, POOL_KIND, InferenceObjective, InferencePool


def applies_to(objective: InferenceObjective, pool: InferencePool) -> bool:
    if objective.namespace != pool.namespace:
        return False
    for ref in objective.pool_refs:
        if ref.name == pool.name and ref.group == POOL_GROUP and ref.kind == POOL_KIND:
            return True
    return objective.pool_selector is not None and objective.pool_selector.matches(pool.labels)
