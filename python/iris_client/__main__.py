"""``python3 -m iris_client``: see ``iris_client.cli``."""

import sys

from .cli import main

sys.exit(main())
