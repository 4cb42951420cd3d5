"""The Jenga two-level pool: page sizes (sizing), bookkeeping (pool), torch views (layout).

layout.py imports torch; it is not imported here so that the pure-Python paths stay light.
"""

from jenga_sglang.pool.pool import JengaPool
from jenga_sglang.pool.sizing import (
    PoolGeometry,
    StateLayout,
    TypeGeometry,
    compute_geometry,
    geometry_for_spec,
    state_layout,
)

__all__ = [
    "JengaPool",
    "PoolGeometry",
    "StateLayout",
    "TypeGeometry",
    "compute_geometry",
    "geometry_for_spec",
    "state_layout",
]
