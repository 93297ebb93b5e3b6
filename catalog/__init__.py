"""The catalogue: accounts and their tokens, models, versions, deployments and grants.

What they are and how they are looked up (``lookups``, ``cache``), and how they change
(``admin`` for operators, ``management`` for owners over the API). It sits on ``tracker``'s
schema and is read by every entry (api, gateway, lane, director).
"""
