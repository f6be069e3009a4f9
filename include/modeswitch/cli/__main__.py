"""``python -m modeswitch.cli``: the ``modeswitch`` command."""

from __future__ import annotations

import sys

from modeswitch.cli import main

sys.exit(main())
