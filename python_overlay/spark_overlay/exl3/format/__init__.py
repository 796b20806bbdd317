"""Reference EXL3 decoder and packer in pure torch (CPU).

Written from spark-kit's format description (docs: exl3-format.md §1-§2); it
is the ground truth the overlay's CPU path and the Rust decoder are checked
against. Shapes follow exllamav3: W is (in, out), Kp/Np are in/out padded to
128, a trellis is int16 [Kp/16, Np/16, 16*K].

Decoding
    codebook_table(name)          fp16 [65536] table for "3inst" | "mcg" | "mul1"
    weight_hat(trellis, codebook) W_hat fp16 [Kp, Np] (bit-exact codebook values)
    full_weight(trellis, suh, svh, codebook)
                                  W = diag(suh)·Hk·W_hat·Hn·diag(svh), float32 [Kp, Np];
                                  nn.Linear weight = W[:in, :out].T
    full_weight_fp16(...)         W in fp16 with exllamav3's rounding (fp16 after each of
                                  Hk·, ×suh, ·Hn, ×svh): bit-exact with its reconstruction
    forward(x, trellis, suh, svh, codebook, bias=None, in_features=None, out_features=None)
                                  y = x @ W[:in, :out] + bias, computed as
                                  x⊙suh → H per 128 → @W_hat → H per 128 → ⊙svh → +bias
    hadamard_128(dtype)           orthonormal Sylvester H (symmetric, H·H = I)

`codebook` is a name or a table from `codebook_table`.

Checking tensors
    k_from_trellis(shape)         K = shape[-1]/16 ∈ {1..8, 1.5, 2.5, 3.5}
    codebook_from_tensors(names)  marker suffix .mcg / .mul1 → codebook, none → "3inst"
    check_marker(name, tensor, codebook)
    load_linear(tensors, prefix)  validated Exl3Linear (trellis, suh, svh, codebook, k, bias)
    Exl3FormatError               raised for any malformed tensor; the message names it

Low level and packing
    decode_states(trellis)        int32 [T0, T1, 256] states in stream order
    states_to_matrix / matrix_to_states   stream order ↔ [Kp, Np] layout (tensor-core permutation)
    tile_permutation()            perm[t] = 16*r + c
    pack_states(states, k)        [..., 256] states → int16 [..., 16K] trellis words
    pack_matrix(state_matrix, k)  [Kp, Np] states → trellis
    states_from_symbols(symbols, k), states_are_valid(states, k)
    random_trellis(t0, t1, k, generator) → (trellis, states), a valid random pack
"""

from .codebook import (
    CODEBOOK_3INST,
    CODEBOOK_MCG,
    CODEBOOK_MUL1,
    CODEBOOKS,
    MARKER_VALUES,
    codebook_table,
)
from .errors import Exl3FormatError
from .linear import (
    Exl3Linear,
    check_marker,
    codebook_from_tensors,
    forward,
    full_weight,
    full_weight_fp16,
    hadamard_128,
    k_from_trellis,
    load_linear,
    unpack_signs,
    weight_hat,
)
from .pack import pack_matrix, pack_states, random_trellis, states_are_valid, states_from_symbols
from .trellis import (
    VALID_K,
    decode_states,
    matrix_to_states,
    states_to_matrix,
    tile_permutation,
)

__all__ = [
    "CODEBOOK_3INST",
    "CODEBOOK_MCG",
    "CODEBOOK_MUL1",
    "CODEBOOKS",
    "MARKER_VALUES",
    "VALID_K",
    "Exl3FormatError",
    "Exl3Linear",
    "check_marker",
    "codebook_from_tensors",
    "codebook_table",
    "decode_states",
    "forward",
    "full_weight",
    "full_weight_fp16",
    "hadamard_128",
    "k_from_trellis",
    "load_linear",
    "matrix_to_states",
    "pack_matrix",
    "pack_states",
    "random_trellis",
    "states_are_valid",
    "states_from_symbols",
    "states_to_matrix",
    "tile_permutation",
    "unpack_signs",
    "weight_hat",
]
