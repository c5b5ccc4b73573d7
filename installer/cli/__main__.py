"""`python -m installer.cli …` = `gpu-install …`."""

import sys

from installer.cli import main

sys.exit(main())
