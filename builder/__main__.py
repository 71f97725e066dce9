"""`python -m builder build ...`"""

import os
import sys

from builder.cli import main

status = main()
# Everything is written and closed by now: skip the interpreter's teardown of torch and onnxruntime, which takes
# seconds after the last line (whose time is the whole command's).
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
