"""The runner contract: Cog's HTTP wire protocol plus Conduit's additions.

The only thing the runners and their callers (the director, the synchronous lane) share about
runners: it imports nothing else of Conduit but :mod:`core`, and neither side spells a media
type, header name or wire value of the contract anywhere else. Its modules:
:mod:`~protocol.headers` (header names, media types), :mod:`~protocol.paths`,
:mod:`~protocol.values` (priorities, statuses, events, refusal codes),
:mod:`~protocol.documents` (Cog's bodies and the control API's documents),
:mod:`~protocol.lifecycle` (the control API's lifecycle calls), :mod:`~protocol.timings` (what
a runner says about a run's time), :mod:`~protocol.answers` (the one table that reads a
runner's answer), and the one client every caller uses (:mod:`~protocol.client`, over
:mod:`~protocol.session`, its watching reads in :mod:`~protocol.probes`, what its calls return
in :mod:`~protocol.outcomes`, its exceptions in :mod:`~protocol.errors`).

It describes what coglet 0.23.1 sends and accepts (see the reference notes): a runner's webhook
and terminal payloads carry only ``id``, ``status``, ``logs``, ``output``, ``error`` and
``metrics`` -- never ``input`` or timestamps, which the platform fills in itself.

Conduit's additions, all ignored by (and absent from) a stock Cog server:

- ``Accept: application/x-ndjson`` on a ``PUT /predictions/<id>`` asks for the prediction's
  snapshots down the response; ``If-Match: *`` makes the ``PUT`` an attach that starts nothing
  (``412`` when the prediction is not running there).
- ``X-Tenant-ID``, ``X-Priority`` (and ``X-Cache-Mode`` / ``X-Cache-Tag``) on requests;
  ``X-Conduit-Deadline: <seconds>`` on a start, the time left before the director gives the
  prediction up (a model pool host refuses what it cannot load and run in that time);
  ``X-Queue-Wait-Ms``, ``X-GPU-Time-Ms``, ``X-Processing-Time``, ``X-Cache-Hit`` and
  ``X-Cache-Tokens-Reused`` on every prediction response.
- The control API of the runner API spec (seed 004), its documents with the spec's field
  names; refusals that are not Cog's own are RFC 9457 problem+json, ``code`` naming them.
- ``Authorization: Bearer <CONDUIT_RUNNER_TOKEN>`` on every request but the health checks,
  when the runner has a token (401 ``unauthorized`` without it).
"""
