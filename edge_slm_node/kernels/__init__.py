"""Numba kernels. Importing the package sets two process-wide things before any kernel compiles
or any parallel region starts:

- idle numba workers sleep instead of spin (OMP_WAIT_POLICY=PASSIVE unless already set): a
  spinning worker would hold a core the node's other threads and processes need;
- LLVM's machine instruction scheduler is off (MACHINE_SCHEDULER_OFF). It hoists every load of a
  4-token tile's block (the activations' broadcasts, 32 a block for Q8_0) to the top of the loop
  body for their latency, which needs more than the 32 vector registers, so the loop stored 11
  (Q4_1) to 18 (Q8_0) of them to the stack and read them back each block; without it the instructions keep the
  order the kernels write them in (token after token) and the out-of-order core overlaps the loads
  itself. Measured 2026-12-06 on the AMD EPYC host (README, "Machine scheduler off"): the Q8_0 head
  for 4 tokens 1.95 -> 1.28 ms, the Q4_1 4-token tiles 4-7 % faster, one-token kernels unchanged.
  The option is global to LLVM in this process and read when a function is compiled:
  scripts/setup.sh recompiles every kernel when a file here changes.
"""
import os

import llvmlite.binding

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

MACHINE_SCHEDULER_OFF = "-enable-misched=false"
llvmlite.binding.set_option("edge_slm_node", MACHINE_SCHEDULER_OFF)
