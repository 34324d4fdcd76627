"""``external`` harness: an outside agent program per episode, talking to the policy through a
loopback OpenAI-compatible endpoint that records its turns token-exactly.

``harness.py`` runs the episodes, ``endpoint.py`` is the server (chat completions and the
episode's Lean tools), ``session.py`` records one episode's requests as token-id segments, and
``program.py`` runs the program with its bounds.
"""

from __future__ import annotations

from .harness import ExternalHarness

__all__ = ["ExternalHarness"]
