#!/usr/bin/env python3
"""Container healthcheck: exit 0 when Triton's HTTP `/v2/health/live` answers 200.

Live, not ready: Triton opens its endpoints only after the models of `--load-model=*` are loaded
(and exits on a failure with --exit-on-error), so live at start means loaded; afterwards strict
readiness turns false while any model is loaded or unloaded through the repository API, which an
admin reload of one model must not turn into an unhealthy container.
Plain standard library, so it works in the NGC image and in the CPU image alike (no curl needed).
"""

import sys
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v2/health/live"

try:
    with urllib.request.urlopen(URL, timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
