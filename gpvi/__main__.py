"""``python -m gpvi``: see :mod:`gpvi.cli`."""

from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
