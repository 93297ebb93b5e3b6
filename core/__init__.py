"""The ground floor every other package stands on, and which imports none of them.

One home each for what several parts of Conduit need alike: logging (``logs``), the backoff
formula and the ``Retry-After`` policy (``backoff``), what counts as a transient failure of a
peer (``unreachable``) or of Redis or Postgres (``transient``), the loop run every few seconds
(``periodic``), the asyncio shell around a sans-IO core (``shell``), the SSRF guard
(``ssrf``), free loopback ports (``ports``) and ids (``ids``). Only the standard library and
third-party packages are imported here; ``transient`` alone imports redis-py and SQLAlchemy, so
a runner (which ships without SQLAlchemy) never imports it.
"""
