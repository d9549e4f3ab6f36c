"""infercast.cli: the ``infercast`` command.

Importing it is the command's start (``python -m infercast`` and the console script both come
here before numpy loads): numpy's BLAS is set to one thread (``OPENBLAS_NUM_THREADS``,
``MKL_NUM_THREADS`` and ``OMP_NUM_THREADS`` = 1, unless the environment sets them). infercast's
arrays are small, so a BLAS thread pool only spins beside the main thread (~0.13 s of CPU per
search on two cores), and the spare CPUs go to the command's own worker processes
(``--jobs``)."""

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
