"""Cog-protocol runners: the process that hosts one model and speaks Cog's HTTP API.

``protocol`` holds the wire models a director imports; ``runners.server`` is the
aiohttp shell; ``runners.service`` owns slots, setup and in-flight predictions;
``runners.models`` holds the models themselves. Nothing here imports the platform's other
packages, so a model image can ship this package alone.
"""

COG_VERSION = "0.23.1-conduit"
"""Reported as ``cog_version`` and in health checks: coglet's protocol version, our build."""
