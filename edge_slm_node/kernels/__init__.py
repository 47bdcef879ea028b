"""Numba kernels. Importing the package makes idle numba workers sleep instead of spin
(OMP_WAIT_POLICY=PASSIVE unless already set; see kernels/matmul.py "Threads"): it must
happen before the first parallel region starts numba's threads."""
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
