"""``python -m lantern.workload``: the harness a VM boots into."""

from __future__ import annotations

import sys

from lantern.workload.harness import main

if __name__ == "__main__":
    sys.exit(main())
