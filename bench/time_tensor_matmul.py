"""CPU time per call of one GGUF tensor's matmul, for before/after comparisons across revisions:
run it alternately from two checkouts (a git worktree of the old one) and compare medians.

    .venv/bin/python bench/time_tensor_matmul.py [--repo DIR] [--model NAME|PATH] TENSOR TOKENS [REPEATS]

--repo: the checkout whose edge_slm_node is timed (default: this one). This thread's CPU time
over REPEATS calls of Linear.apply on the calling thread (after one warm-up call), so another
process on the other core matters less than with wall time; on this VM single runs still vary
by up to 50 %.
"""
import argparse
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("tensor", help="e.g. blk.0.ffn_down.weight")
parser.add_argument("tokens", type=int)
parser.add_argument("repeats", type=int, nargs="?", default=100)
parser.add_argument("--repo", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct-q4_k_m")
args = parser.parse_args()
sys.path.insert(0, os.path.abspath(args.repo))

import numpy as np  # noqa: E402

from edge_slm_node.kernels.quants.common import new_scratch  # noqa: E402
from edge_slm_node.model.catalog import resolve  # noqa: E402
from edge_slm_node.model.gguf_file import GGUFFile  # noqa: E402
from edge_slm_node.model.linear import Linear  # noqa: E402

gguf_file = GGUFFile(resolve(args.model))
raw = np.array(gguf_file.tensor_bytes(args.tensor))
quant = gguf_file.tensors[args.tensor].quant
length = raw.shape[1] // quant.type_size * quant.block_size
linear = Linear(args.tensor, raw, quant, length)
x = np.random.default_rng(0).standard_normal((args.tokens, length)).astype(np.float32)
scratch = new_scratch(args.tokens, length, set(linear.scratch_slots))
out = np.zeros((args.tokens, linear.out_features), np.float32)
linear.apply(x, scratch, out, False)
started = time.thread_time()
for _ in range(args.repeats):
    linear.apply(x, scratch, out, False)
print(f"{os.path.abspath(args.repo)} {quant.name} {args.tensor} T={args.tokens}: "
      f"{(time.thread_time() - started) / args.repeats * 1e6:.1f} us CPU per call")
