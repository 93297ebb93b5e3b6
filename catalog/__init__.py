"""The catalogue: accounts and their tokens, models, versions, deployments and grants.

What they are (``records``) and how they are looked up (``lookups``, ``cache``); how they
change, by one write path per concept that takes a principal (``models``, ``versions``,
``deployments``, by the ``rules`` every principal follows: an account over the API, the
operator with ``conduit admin``), and the operator's own writes (``writes``, ``accounts``).
It sits on ``tracker``'s schema and is read by every entry (api, gateway, lane, director).
"""
