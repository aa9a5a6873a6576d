"""``python -m tunelab.offline install|bundle-runtime|bundle-orchestrator ...`` (see ``tunelab.offline.cli``)."""

import sys

from tunelab.offline.cli import main

sys.exit(main())
