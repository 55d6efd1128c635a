"""``python -m tilearray ...``: the command line (see :mod:`tilearray.cli`)."""

import sys

from tilearray.cli import main

# The guard matters: a LocalCluster starts worker processes that re-import
# the main module; they must not run the command again.
if __name__ == "__main__":
    sys.exit(main())
