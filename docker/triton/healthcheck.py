#!/usr/bin/env python3
"""Container healthcheck: exit 0 when Triton's HTTP `/v2/health/ready` answers 200.

Plain standard library, so it works in the NGC image and in the CPU image alike (no curl needed).
"""

import sys
import urllib.request

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/v2/health/ready"

try:
    with urllib.request.urlopen(URL, timeout=3) as response:
        sys.exit(0 if response.status == 200 else 1)
except OSError:
    sys.exit(1)
