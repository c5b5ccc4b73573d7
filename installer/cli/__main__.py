"""`python -m installer.cli …` = `gpu-install …`."""

import sys

from installer.cli import main

if __name__ == "__main__":
    sys.exit(main())
