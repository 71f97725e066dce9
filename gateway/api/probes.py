"""The probe and scrape paths: liveness, readiness and Prometheus.

They are public (no API key, api/auth.py), not traced (gateway/tracing.py gets them from the app
factory), not counted in the request metrics, and never refused by the in-flight limit
(api/edge.py): a probe is how an operator sees an overloaded gateway.
"""

from __future__ import annotations

PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
