"""``python -m simulator`` is the ``astrasim-py`` command."""

import sys

from simulator.cli import main

sys.exit(main())
