"""``python -m pipeline.cli``: the ``krr`` command."""

import sys

from pipeline.cli import main

sys.exit(main())
