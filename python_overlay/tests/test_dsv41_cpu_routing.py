"""The torch stand-in for vLLM's DeepSeek V4 MoE routing on a CPU (dsv41_harness.sqrtsoftplus_topk).

Released vLLM 0.32.0 routes DeepSeek V4 on its CPU platform through torch.ops._C.biased_topk_cpu /
hash_topk_cpu (vllm/model_executor/layers/fused_moe/router/cpu_router.py:81, `_sqrtsoftplus_bias_topk`). Only
vllm/_C.abi3.so holds those ops, and vllm/platforms/cpu.py:631 (import_kernels) loads it only on a CPU with
AVX512-BF16; elsewhere it loads _C_AVX512 / _C_AVX2, which lack them, and the contract harness
(test_dsv41_contract.py) routes with the stand-in. Proven here:

* where the kernel runs, the stand-in equals vLLM's own `_sqrtsoftplus_bias_topk` (the correction-bias path and
  the hash path, 64 and 256 experts, top-6, a scaling factor of 2.5): the same experts, weights within the
  kernel's fp32 rounding; where it cannot run, that test skips saying which library vLLM loaded and why;
* everywhere, the stand-in equals a float64 routing written here from the definition, and has the properties
  routing must have (weights sum to the scaling factor, distinct experts, the bias steers the choice and not the
  weight, the hash table's experts in the table's order), and it takes the keywords vLLM calls it with.

Experts are compared as sets (sorted by id): the MoE output sums over the chosen experts, so their order does not
change it. Rows where two biased scores tie within 1e-4 at the top-k boundary are left out of the id comparison:
there fp32 rounding may pick either, in the kernel as in the stand-in.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import dsv41_harness as harness

TOP_K, SCALE, VOCAB = 6, 2.5, 512
SHAPES = [(1, 64), (9, 64), (33, 256), (128, 256)]  # (tokens, experts); vLLM's kernel takes 64/128/256/384 experts
PATHS = ("bias", "hash")
MARGIN = 1e-4  # a top-k boundary gap below this is a near-tie fp32 rounding may break either way


def _inputs(tokens: int, experts: int, seed: int, dtype: torch.dtype = torch.float32) -> dict:
    """Router logits, a correction bias, token ids and a hash table (VOCAB rows of TOP_K distinct experts)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.stack([torch.randperm(experts, generator=g)[:TOP_K] for _ in range(VOCAB)]).to(torch.int32)
    return {
        "router_logits": (torch.randn(tokens, experts, generator=g) * 2).to(dtype),
        "e_score_correction_bias": torch.randn(experts, generator=g) * 0.1,
        "input_ids": torch.randint(0, VOCAB, (tokens,), generator=g),
        "table": table,
    }


def _route(fn, inputs: dict, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """`fn` called the way cpu_router.py:229 calls the routing: by keyword, the bias passed on hash layers too."""
    return fn(router_logits=inputs["router_logits"], top_k=TOP_K, renormalize=True,
              e_score_correction_bias=inputs["e_score_correction_bias"], routed_scaling_factor=SCALE,
              input_ids=inputs["input_ids"], hash_indices_table=inputs["table"] if path == "hash" else None)


def _weight64(router_logits: torch.Tensor) -> torch.Tensor:
    """sqrt(log(1 + e^logit)) in float64: DeepSeek V4's routing weight from its definition."""
    return torch.log1p(torch.exp(router_logits.double())).sqrt()


def _reference(inputs: dict, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek V4 routing from its definition, in float64: weight = sqrt(log(1 + e^logit)); experts from the
    table, else the highest weight + bias; their unbiased weights scaled to sum to SCALE."""
    weight = _weight64(inputs["router_logits"])
    if path == "hash":
        ids = inputs["table"][inputs["input_ids"]].long()
    else:
        ids = torch.argsort(weight + inputs["e_score_correction_bias"].double(), dim=-1, descending=True)[:, :TOP_K]
    chosen = weight.gather(1, ids)
    return chosen / chosen.sum(-1, keepdim=True) * SCALE, ids


def _clear_rows(inputs: dict, path: str) -> torch.Tensor:
    """Rows whose choice no rounding can change: every hash row; bias rows with a top-k boundary gap over MARGIN."""
    logits = inputs["router_logits"]
    if path == "hash":
        return torch.ones(logits.shape[0], dtype=torch.bool)
    scores = _weight64(logits) + inputs["e_score_correction_bias"].double()
    top = scores.topk(TOP_K + 1, dim=-1).values
    return (top[:, TOP_K - 1] - top[:, TOP_K]) > MARGIN


def _by_id(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = ids.long().argsort(-1)
    return weights.double().gather(1, order), ids.long().gather(1, order)


def _assert_same_routing(got, want, clear: torch.Tensor, rtol: float, atol: float, what: str) -> None:
    assert clear.float().mean() >= 0.8, f"{what}: only {int(clear.sum())}/{clear.numel()} rows without a near-tie"
    got_w, got_ids = _by_id(*got)
    want_w, want_ids = _by_id(*want)
    assert torch.equal(got_ids[clear], want_ids[clear]), f"{what}: experts differ"
    torch.testing.assert_close(got_w[clear], want_w[clear], rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens,experts", SHAPES)
def test_the_stand_in_equals_a_float64_routing_from_the_definition(tokens, experts, dtype, path):
    inputs = _inputs(tokens, experts, seed=tokens * 1000 + experts, dtype=dtype)
    got = _route(harness.sqrtsoftplus_topk, inputs, path)
    _assert_same_routing(got, _reference(inputs, path), _clear_rows(inputs, path), rtol=2e-6, atol=1e-7,
                         what=f"{path} {tokens}x{experts} {dtype}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("tokens,experts", SHAPES)
def test_the_stand_in_returns_what_vllms_fused_moe_reads(tokens, experts, path):
    """fp32 weights summing to the scaling factor, int32 ids of distinct experts, contiguous (cpu_fused_moe reads
    them as flat buffers, cpu_router.py:248); on a hash layer the table's experts, in the table's order."""
    inputs = _inputs(tokens, experts, seed=7 + tokens)
    weights, ids = _route(harness.sqrtsoftplus_topk, inputs, path)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32, (weights.dtype, ids.dtype)
    assert weights.shape == ids.shape == (tokens, TOP_K) and weights.is_contiguous() and ids.is_contiguous()
    torch.testing.assert_close(weights.sum(-1), torch.full((tokens,), SCALE), rtol=1e-6, atol=0)
    assert bool((weights > 0).all()) and bool(((ids >= 0) & (ids < experts)).all()), ids
    assert bool((ids.sort(-1).values.diff(dim=-1) > 0).all()), f"an expert chosen twice in a row: {ids}"
    if path == "hash":
        assert torch.equal(ids, inputs["table"][inputs["input_ids"]]), "not the table's experts in its order"


def test_the_bias_steers_the_choice_and_not_the_weight():
    """A large bias on each row's weakest expert gets it chosen, with its unbiased (smallest) weight."""
    inputs = _inputs(16, 64, seed=3)
    logits = inputs["router_logits"]
    weakest = logits.argmin(-1)
    bias = torch.zeros(16, 64).scatter_(1, weakest[:, None], 100.0)
    for row in range(16):  # one bias per call: the bias is per expert, shared by the tokens
        one = {**inputs, "router_logits": logits[row:row + 1], "e_score_correction_bias": bias[row]}
        weights, ids = _route(harness.sqrtsoftplus_topk, one, "bias")
        assert int(ids[0, 0]) == int(weakest[row]), (row, ids)  # the highest biased score, first
        assert float(weights[0, 0]) == float(weights[0].min()), (row, weights)
        got, want = _by_id(weights, ids), _by_id(*_reference(one, "bias"))
        assert torch.equal(got[1], want[1]), (row, got[1], want[1])
        torch.testing.assert_close(got[0], want[0], rtol=2e-6, atol=1e-7)


def test_the_stand_in_refuses_what_deepseek_v4_routing_never_gets():
    inputs = _inputs(2, 64, seed=5)
    with pytest.raises(ValueError, match="renormalizes"):
        harness.sqrtsoftplus_topk(inputs["router_logits"], TOP_K, False, inputs["e_score_correction_bias"],
                                  SCALE, None, None)
    with pytest.raises(ValueError, match="token ids"):
        harness.sqrtsoftplus_topk(inputs["router_logits"], TOP_K, True, None, SCALE, None, inputs["table"])
    with pytest.raises(ValueError, match="e_score_correction_bias"):
        harness.sqrtsoftplus_topk(inputs["router_logits"], TOP_K, True, None, SCALE, None, None)


def _cpu_router():
    """vLLM's CPU router module, or a skip saying why this vLLM has none."""
    try:
        with warnings.catch_warnings():
            # vLLM's MoE stack imports torch._inductor, whose torch/utils/mkldnn.py trips torch's own deprecation
            # of torch.jit.script_method: torch's noise, not this test's.
            warnings.filterwarnings("ignore", "`torch.jit.script_method` is deprecated", DeprecationWarning)
            from vllm.model_executor.layers.fused_moe.router import cpu_router
    except Exception as err:  # noqa: BLE001 - a vLLM without the CPU platform cannot import it at all
        pytest.skip(f"vLLM's CPU router cannot be imported here ({type(err).__name__}: {err})")
    if not hasattr(cpu_router, harness.ROUTER_ATTR):
        pytest.fail(f"{harness.ROUTER_MODULE}.{harness.ROUTER_ATTR} is gone: "
                    "the harness's routing patch needs re-checking")
    return cpu_router


def test_the_stand_in_takes_the_keywords_vllm_calls_it_with():
    vllm_routing = getattr(_cpu_router(), harness.ROUTER_ATTR)
    assert vllm_routing is not harness.sqrtsoftplus_topk, "the harness's patch leaked into this process"
    want = list(inspect.signature(vllm_routing).parameters)
    assert list(inspect.signature(harness.sqrtsoftplus_topk).parameters) == want, want


def _vllm_kernel_routing():
    """vLLM's own routing function where its kernel runs on this CPU, else a skip naming the library and flags."""
    cpu_router = _cpu_router()
    missing = harness.routing_ops_missing()
    if missing:
        libraries = ", ".join(harness.kernel_libraries()) or "no vllm/_C* library"
        pytest.skip(f"vLLM's DeepSeek V4 routing kernel cannot run on this CPU: torch.ops._C lacks "
                    f"{', '.join(missing)} (vLLM loaded {libraries}; CPU {harness.cpu_flags()}; the ops are only in "
                    f"vllm/_C.abi3.so, which vllm/platforms/cpu.py loads on AVX512-BF16 CPUs)")
    routing = getattr(cpu_router, harness.ROUTER_ATTR)
    assert routing is not harness.sqrtsoftplus_topk, "the harness's patch leaked into this process"
    return routing


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("tokens,experts", SHAPES)
def test_the_stand_in_equals_vllms_routing_kernel(tokens, experts, path):
    """The kernel computes softplus as log(1 + exp_u20(x)) in fp32 (exp_u20: ATen's faster exp, about 20 ulp):
    relative errors near 1e-6 for the logits drawn here, hence the tolerance; the experts are the same."""
    kernel = _vllm_kernel_routing()
    inputs = _inputs(tokens, experts, seed=100 + tokens * 7 + experts)
    want = _route(kernel, inputs, path)
    got = _route(harness.sqrtsoftplus_topk, inputs, path)
    assert want[0].dtype == got[0].dtype and want[1].dtype == got[1].dtype, (want[0].dtype, want[1].dtype)
    _assert_same_routing(got, want, _clear_rows(inputs, path), rtol=1e-5, atol=1e-5 * SCALE,
                         what=f"kernel {path} {tokens}x{experts}")
