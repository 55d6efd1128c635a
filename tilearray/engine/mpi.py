"""``python -m tilearray.engine.mpi``: the MPI launcher, and the module path
of the MPI boot users know (see :mod:`tilearray.engine.runtime.mpi`)."""

import sys

from .runtime.mpi import *  # noqa: F403
from .runtime.mpi import main, start  # noqa: F401
from .runtime.mpirun import (  # noqa: F401
    CLIENT_RANK,
    FINALIZE_ENV,
    STATUS_ENV,
    await_client,
    decide,
    find_mpiexec,
    leave_launcher_group,
    mark_abort,
    mpi_flavor,
    mpirun,
    start_heartbeat,
    write_status,
)

if __name__ == "__main__":
    sys.exit(main())
