"""A fresh worker process of `launch()`: `python -m tpu_nb.runtime.parallel RUNDIR`."""

import sys

from tpu_nb.runtime.parallel._replicas import worker_main

worker_main(sys.argv[1])
