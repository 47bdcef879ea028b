"""Does a sequence's result depend on how its tokens are split into calls? One prompt, prefilled
in one call, in calls of --chunk tokens each summed as a call of its own (as llama.cpp would
sum them), and in the same chunks carrying the whole prompt's call shapes (as the engine's
chunked prefill runs them); then greedy decode: the first logits' largest difference and the
id lists.

    .venv/bin/python bench/check_call_order.py [--model NAME|PATH] [--chunk 3] [--tokens 12]

Row-independent kernels (F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) give bit-equal logits in every
variant; the K-quant kernels follow llama.cpp's call-size-dependent orders, so the second
variant differs and the third must be bit-equal to the first (README, Models).
"""
import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test" / "model"))

from edge_slm_node.model.loader import load_model          # noqa: E402
from edge_slm_node.model.transformer import Transformer   # noqa: E402
from scattered_greedy import BLOCK, scattered_greedy      # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="", help="a catalog name or a GGUF path (default: SmolLM2)")
    parser.add_argument("--text", default="Question: what does G01 do on a CNC mill? Answer:")
    parser.add_argument("--chunk", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args()
    model = load_model(args.model)
    runner = Transformer(model.config, model.weights, max_batch_tokens=512, max_context=640, max_logits_rows=1)
    ids = model.tokenizer.encode(args.text, parse_special=False)
    blocks = (len(ids) + args.tokens) // BLOCK + 2
    one, first_one = scattered_greedy(model, runner, ids, args.tokens, blocks=blocks)
    chunked, first_chunked = scattered_greedy(model, runner, ids, args.tokens, blocks=blocks, chunk=args.chunk)
    shaped, first_shaped = scattered_greedy(model, runner, ids, args.tokens, blocks=blocks, chunk=args.chunk,
                                            chunks_as_one_call=True)
    print(f"{args.model or 'SmolLM2-135M (bundled)'}: {len(ids)}-token prompt (largest logit "
          f"{np.abs(first_one).max():.4g})")
    print(f"  greedy ids, one call:                     {one}")
    for name, ids_, first in ((f"{args.chunk}-token calls", chunked, first_chunked),
                              (f"{args.chunk}-token chunks of one call", shaped, first_shaped)):
        print(f"  greedy ids, {name + ':':30s}{ids_}")
        print(f"    first logits bit-equal to one call: {np.array_equal(first_one, first)}, largest difference "
              f"{np.abs(first_one - first).max():.4g}")


if __name__ == "__main__":
    main()
