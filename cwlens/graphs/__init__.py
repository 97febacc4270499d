"""The contribution graph: :func:`graph` builds a text's :class:`ContributionGraph` (the
streaming engine, top edges per node), :meth:`ContributionGraph.routes` its information-flow
routes, :mod:`cwlens.graphs.viewer` the offline HTML viewer.

(The package is ``cwlens.graphs``, not ``cwlens.graph``: ``cwlens.graph`` is the function.)
"""

from cwlens.graphs.build import graph
from cwlens.graphs.result import ContributionGraph

__all__ = ["ContributionGraph", "graph"]
