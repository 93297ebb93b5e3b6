"""What a failed HTTP exchange with a peer (a runner, a webhook receiver) raises.

Kept apart from :mod:`core.transient` (Redis and Postgres outages) so that a runner, which
ships without SQLAlchemy, can import it.
"""

from __future__ import annotations

from typing import Final

import aiohttp

#: A peer that cannot be reached, stops answering, or breaks off mid-answer (aiohttp's own
#: errors, its timeouts, and socket errors it lets through). Never a refusal: those are answers.
UNREACHABLE: Final = (aiohttp.ClientError, TimeoutError, OSError)
