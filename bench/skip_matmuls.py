"""A matmul kernel that does nothing, to time a forward pass without its matmuls (the rest:
attention, norms, RoPE, KV writes, barriers, Python) by difference."""
from numba import njit

from edge_slm_node.kernels.layers import matmul_table
from edge_slm_node.kernels.quants.common import MATMUL_SIGNATURE


@njit(MATMUL_SIGNATURE, cache=True, nogil=True)
def no_matmul(packed, tail, part_ends, x, scratch, outs):
    """Stands in for every matmul kernel: does nothing."""
    pass


def skipping_table(real):
    """A kernel table like `real` (Transformer.matmuls[...]) with every entry no_matmul."""
    return matmul_table([no_matmul] * len(real))
