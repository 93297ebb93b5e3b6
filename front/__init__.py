"""The one front door under every entry (the REST routes, ``/run``, the gateway's faces, the
operator page's retry, trainings): where a request goes and whether it may be made.

``destinations``: one :class:`~front.destinations.Destination` and one resolution (a model, a
version, a deployment, a block); ``admission``: the input checked against its version's schema
and made storable, its file references, the priority honoured, the account's rate of creates,
the prediction built; ``durable``: stored, then queued; ``lanes``: a destination handed to the
synchronous lane; ``cluster``: the resources every entry process opens, one way. The faces only
map what is refused here to their own statuses.
"""
