"""The one limiter: every limit Conduit keeps on who may do how much, by two rules over one core.

- :mod:`tracker.limits.gcra`: a rate with a burst (the generic cell rate algorithm): an
  account's rate of creates and of uploads (``tracker.rate_limits``), kept in Redis; and, by the
  same arithmetic held in memory, a client address's budget of failed authentications
  (``catalog.token_checks``), which must answer before any query with no round trip.
- :mod:`tracker.limits.windows`: counts over sliding windows, several limits checked and
  counted together (the gateway's quota, ``gateway.quota``).
- :mod:`tracker.limits.script`: what both Redis rules share: the Lua script's clock (Redis's
  own ``TIME`` unless a test injects one), letting requests through while Redis is away with
  one warning per outage, and a wait said in whole seconds.

Each limit's keys are built where every Redis key is (``tracker.keys``,
``tracker.gateway_keys``); the limiter is given them.
"""
