# A batch script WITHOUT the `if __name__ == "__main__":` guard: worker ranks
# must not re-import it in their Nanny's spawned worker process (which would
# call MPI_Init there and leave the client waiting for workers).
import os
import sys

import numpy as np

import tilearray as ta

d = sys.argv[1]
engine = ta.Engine.mpi(memory_per_worker="1GiB")
np.save(os.path.join(d, "sum.npy"), ta.open(os.path.join(d, "a.zarr")).sum(axis=0).compute())
