"""Greedy decoding against llama.cpp's reference ids and logits for any installed GGUF model.

    python bench/check_fidelity.py --model PATH [--reference JSON] [--tokens N] [--numerics auto|avx2|avx512]

The reference is a fixture written by bench/make_reference_fixtures.py ("cases", top-5 logits at
every generated position; default: llama_cpp_greedy_<model file stem>.json in test/fixtures or
bench/results), or a file of the same kind with "prompts" (top-5 at the first step only).
Each prompt is prefilled as one batch (as llama.cpp did), then decoded greedily; per prompt it
prints how many ids match, the largest difference on the reference's recorded logits while they
match, and at a divergence both sides' top logits and margins. Not a test: the report of a run.
numerics auto: the AVX-512 orders if the reference's system_info names AVX512, else AVX2's.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edge_slm_node.kv.arena import KVArena  # noqa: E402
from edge_slm_node.model.loader import load_model  # noqa: E402
from edge_slm_node.model.transformer import ForwardBatch, Transformer  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BLOCK = 16


def find_reference(model: Path) -> Path:
    name = model.name.removesuffix(".gguf")
    short = name.removesuffix("-q4_k_m").removesuffix("-instruct")
    for folder in (REPO / "test" / "fixtures", REPO / "bench" / "results"):
        for stem in (name, short):
            path = folder / f"llama_cpp_greedy_{stem}.json"
            if path.is_file():
                return path
    sys.exit(f"no reference for {model.name}: pass --reference (bench/make_reference_fixtures.py writes one)")


def load_reference(path: Path) -> tuple[list, str]:
    """-> ([(name, prompt text, prompt_ids, generated_ids, [top-5 per recorded step])], system_info)."""
    data = json.loads(path.read_text())
    if "cases" in data:
        cases = [(c["name"], c["prompt_text"], c["prompt_ids"], c["generated_ids"], c["top5"]) for c in data["cases"]]
        return cases, data["provenance"]["llama_cpp_system_info"]
    cases = []
    for i, p in enumerate(data["prompts"]):
        top = p.get("top5_logits_first_step")
        steps = [{"ids": [t["id"] for t in top], "logits": [t["logit"] for t in top]}] if top else []
        cases.append((f"prompt{i}", p.get("rendered"), p["prompt_ids"], p["generated_ids"], steps))
    return cases, data.get("system_info", "")


class Greedy:
    def __init__(self, model, avx512: bool, max_prompt: int, count: int):
        self.model = model
        context = max_prompt + count + 1
        self.blocks = -(-context // BLOCK)
        self.runner = Transformer(model.config, model.weights, max_batch_tokens=max(max_prompt, 1), max_context=context,
                                  max_logits_rows=1, avx512=avx512)

    def run(self, prompt_ids, count):
        c = self.model.config
        arena = KVArena(c.num_layers, c.num_kv_heads, c.head_dim, num_blocks=self.blocks, block_size=BLOCK)
        table = np.random.default_rng(len(prompt_ids)).permutation(self.blocks).astype(np.int32)[None, :]

        def forward(tokens, start):
            pos = np.arange(start, start + len(tokens), dtype=np.int32)
            slots = (table[0, pos // BLOCK] * BLOCK + pos % BLOCK).astype(np.int32)
            batch = ForwardBatch(np.array(tokens, np.int32), pos, np.zeros(len(tokens), np.int32), pos + 1, slots,
                                 table, np.array([len(tokens) - 1], np.int32))
            return self.runner.forward(batch, arena.data)[0].copy()

        logits = forward(prompt_ids, 0)
        ids, steps = [], []
        started = time.perf_counter()
        for _ in range(count):
            steps.append(logits)
            ids.append(int(np.argmax(logits)))
            logits = forward([ids[-1]], len(prompt_ids) + len(ids) - 1)
        return ids, steps, count / (time.perf_counter() - started)


def top(logits, k=3):
    order = np.argsort(-logits, kind="stable")[:k]
    return [(int(i), round(float(logits[i]), 4)) for i in order]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--reference", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=0, help="ids to decode per prompt (default: all the reference has)")
    parser.add_argument("--numerics", choices=["auto", "avx2", "avx512"], default="auto")
    args = parser.parse_args()
    reference = args.reference or find_reference(args.model)
    cases, system_info = load_reference(reference)
    avx512 = "AVX512 = 1" in system_info if args.numerics == "auto" else args.numerics == "avx512"
    count = args.tokens or max(len(c[3]) for c in cases)
    model = load_model(str(args.model))
    greedy = Greedy(model, avx512, max(len(c[2]) for c in cases), count)
    print(f"{args.model.name} vs {reference.relative_to(REPO) if reference.is_relative_to(REPO) else reference}\n"
          f"llama.cpp: {system_info}\nnumerics: {'avx512' if avx512 else 'avx2'}, {count} ids per prompt")
    print(f"{'prompt':<22} {'prompt ids':>10} {'tokenizer':>9} {'match':>9} {'max |dlogit|':>12} {'tok/s':>6}")
    total = matched = 0
    for name, text, prompt_ids, want, steps in cases:
        n = min(count, len(want))
        ids, logits, speed = greedy.run(prompt_ids, n)
        match = next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), n)
        diffs = [float(np.abs(logits[i][s["ids"]] - np.array(s["logits"], np.float32)).max())
                 for i, s in enumerate(steps[:max(match, 1)]) if i < len(logits)]
        tokenizer = "-" if text is None else ("same" if model.tokenizer.encode(text) == prompt_ids else "DIFFERS")
        print(f"{name:<22} {len(prompt_ids):>10} {tokenizer:>9} {match:>4}/{n:<4} {max(diffs) if diffs else float('nan'):>12.3g}"
              f" {speed:>6.1f}")
        if match < n:
            ours = logits[match]
            print(f"    diverges at {match}: ours {top(ours)} margin {sorted(ours)[-1] - sorted(ours)[-2]:.4f}")
            if match < len(steps):
                s = steps[match]
                print(f"    llama.cpp {list(zip(s['ids'][:3], [round(v, 4) for v in s['logits'][:3]]))} "
                      f"margin {s['logits'][0] - s['logits'][1]:.4f}")
        total += n
        matched += match
    print(f"matching ids before the first divergence: {matched}/{total}")


if __name__ == "__main__":
    main()
