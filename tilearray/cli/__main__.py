"""``python -m tilearray.cli ...``: same as ``python -m tilearray``."""

import sys

from tilearray.cli import main

if __name__ == "__main__":
    sys.exit(main())
