#!/usr/bin/env python3
"""Container healthcheck: exit 0 when the gateway's `/readyz` answers 200 (Triton reachable, models found)."""

import os
import sys
import urllib.request

URL = f"http://127.0.0.1:{os.environ.get('GATEWAY_PORT', '8080')}/readyz"

try:
    with urllib.request.urlopen(URL, timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
