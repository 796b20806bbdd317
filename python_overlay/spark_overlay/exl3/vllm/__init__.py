"""vLLM glue for EXL3: `config` (the "exl3" quantization method), `linear`, `moe`.

`linear` and `moe` never import each other; what they share is in `common`.
"""
