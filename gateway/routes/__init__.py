"""How a task runs, one strategy per route, each over the front door (:mod:`front`):
``durable`` (stored, queued, followed), ``lane`` (a synchronous block through ``/run``'s lane),
``peer`` (another cluster's block), ``graph`` (a task's ``output_ptr`` graph), ``named_graph``
(a registered ``gph-…`` graph); ``step`` runs one block here (lane or durable) and ``admit``
is the front door's admission as the gateway answers it. :class:`gateway.execution.BlockExecutor`
chooses the route."""
