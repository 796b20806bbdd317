"""Run one model with vLLM's offline LLM on the CPU and print greedy results as one JSON line.

    python vllm_greedy.py MODEL_DIR [--max-tokens 8] [--tp 1]

Used by test_exl3_vllm.py in a subprocess (vLLM spawns its own engine and
worker processes; the spark_overlay plugin must be importable through
PYTHONPATH with its dist-info). The last stdout line is
{"prompts": [...], "tokens": [[...]...], "first_logprobs": [{token: logprob}...]}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

PROMPTS = [
    "def main(",
    "import os\n",
    "class Foo:",
    "for i in range(",
    "return self.",
    "# Copyright",
    "if __name__ ==",
    "raise ValueError(",
    "with open(",
    "print(",
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        kv_cache_memory_bytes=32 << 20,
        tensor_parallel_size=args.tp,
        seed=0,
    )
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, logprobs=20, ignore_eos=True)
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    result = {
        "prompts": PROMPTS,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "first_logprobs": [
            {str(t): lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outputs
        ],
    }
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
