"""`python -m builder build ...`"""

from builder.cli import main

raise SystemExit(main())
