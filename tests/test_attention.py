"""`blockscaled.attention.use_packed_gqa` against transformers' `sdpa` on a tiny Llama (grouped-query attention, 4
query heads on 2 key / value heads) with a static cache: the same logits eager and compiled, and the compiled decode
step without `repeat_kv`'s copy of the cache."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from blockscaled.attention import NAME, packed_gqa_attention, use_packed_gqa  # noqa: E402
from blockscaled.kernels.launch import interpreted  # noqa: E402

# the tiny model runs on the CPU: its decode steps reach the kernel only through Triton's interpreter (set by conftest
# where there is no GPU); elsewhere they would take SDPA and test nothing of the kernel
on_the_interpreter = pytest.mark.skipif(not interpreted(), reason="CPU tensors reach the kernel only with TRITON_INTERPRET=1")


def kernel_calls(monkeypatch) -> list:
    """The `keep` of each call of `kernels.decode_attention.decode_attention` (the op's implementation) from now on."""
    from blockscaled.kernels import decode_attention as da

    calls, run = [], da.decode_attention
    monkeypatch.setattr(da, "decode_attention", lambda q, k, v, keep=None, scale=None: calls.append(keep) or run(
        q, k, v, keep, scale))
    return calls


def tiny(seed=0, **over):
    torch.manual_seed(seed)
    cfg = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, attn_implementation="sdpa")
    cfg.update(over)
    config = transformers.LlamaConfig(**cfg)
    return config, transformers.LlamaForCausalLM(config).eval()


def greedy(model, config, prompt, steps, compile_backend=None):
    """Logits of the prompt's last position and of `steps` greedy decode steps, through a static cache."""
    cache = transformers.StaticCache(config=config, max_cache_len=prompt.shape[1] + steps + 2)
    fwd = torch.compile(model, backend=compile_backend, fullgraph=True, dynamic=False) if compile_backend else model
    out = []
    with torch.no_grad():
        n = prompt.shape[1]
        logits = fwd(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(n), use_cache=True).logits
        out.append(logits[:, -1])
        for t in range(steps):
            ids = logits[:, -1:].argmax(-1)
            logits = fwd(input_ids=ids, past_key_values=cache, cache_position=torch.tensor([n + t]),
                         use_cache=True).logits
            out.append(logits[:, -1])
    return torch.stack(out, 1)


@on_the_interpreter
@pytest.mark.parametrize("batch", [1, 3])
def test_packed_gqa_gives_sdpa_logits_eager(batch, monkeypatch):
    calls = kernel_calls(monkeypatch)
    config, model = tiny()
    packed = use_packed_gqa(copy.deepcopy(model))
    assert packed.config._attn_implementation == NAME and model.config._attn_implementation == "sdpa"
    prompt = torch.randint(0, 256, (batch, 9), generator=torch.Generator().manual_seed(batch))
    ref = greedy(model, config, prompt, 5)
    assert not calls
    got = greedy(packed, packed.config, prompt, 5)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert len(calls) == 5 * 2  # each decode step's two layers


@on_the_interpreter
def test_packed_gqa_compiled_gives_sdpa_logits_without_repeat_kv():
    """Compiled (fullgraph, aot_eager: no C++ compiler on the CPU machine), the packed decode gives eager sdpa's
    logits; the decode step's graph has no expand of the cache (sdpa's compiled decode does: the reason for this)."""
    config, model = tiny(seed=1)
    packed = use_packed_gqa(copy.deepcopy(model))
    prompt = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(3))
    ref = greedy(model, config, prompt, 4)

    def graphs_of(m):
        seen = []

        def backend(gm, inputs):
            seen.append(gm)
            return gm.forward

        torch._dynamo.reset()
        logits = greedy(m, m.config, prompt, 4, compile_backend=backend)
        torch._dynamo.reset()
        return logits, seen

    got, packed_graphs = graphs_of(packed)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    _, sdpa_graphs = graphs_of(model)

    def expands(graphs):  # [prefill graph, decode graph]: repeat_kv's expands of the cache to 5-D in the decode one
        decode = graphs[-1]
        return sum(1 for n in decode.graph.nodes
                   if n.op in ("call_method", "call_function") and "expand" in str(n.target) and len(n.args) == 6)

    def split_kernel_calls(graphs):
        return sum(1 for n in graphs[-1].graph.nodes if "decode_attention" in str(n.target))

    assert len(packed_graphs) == 2 and len(sdpa_graphs) == 2
    assert expands(sdpa_graphs) == 2 * config.num_hidden_layers  # repeat_kv of k and v, each layer
    assert expands(packed_graphs) == 0
    assert split_kernel_calls(packed_graphs) == config.num_hidden_layers and split_kernel_calls(sdpa_graphs) == 0
    # every layer's split kernel takes the step's one mask, made by `step_mask` (which inductor cannot inline into a
    # copy per layer, as it did with each layer's [B, S] view of the mask)
    decode = packed_graphs[-1].graph
    masks = {n.args[3] for n in decode.nodes if "decode_attention" in str(n.target)}
    assert len(masks) == 1 and "step_mask" in str(next(iter(masks)).target)


def test_packed_gqa_leaves_other_cases_to_sdpa(monkeypatch):
    """Prefill (several query tokens), no grouping, a mask per head: transformers' sdpa function, unchanged."""
    import transformers.integrations.sdpa_attention as sdpa

    calls = []
    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **k: calls.append(a) or ("sdpa", None))

    class M:
        num_key_value_groups = 2

    q1, kv = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8)
    assert packed_gqa_attention(M(), torch.randn(1, 4, 3, 8), kv, kv, None)[0] == "sdpa"
    assert packed_gqa_attention(M(), q1, kv, kv, torch.zeros(1, 4, 1, 5))[0] == "sdpa"
    M.num_key_value_groups = 1
    assert packed_gqa_attention(M(), torch.randn(1, 2, 1, 8), kv, kv, None)[0] == "sdpa"
    assert len(calls) == 3
    M.num_key_value_groups = 2
    out, _ = packed_gqa_attention(M(), q1, kv, kv, torch.zeros(1, 1, 1, 5, dtype=torch.bool).logical_not())
    assert out.shape == (1, 1, 4, 8) and len(calls) == 3


def test_a_model_not_on_sdpa_is_refused():
    _, model = tiny(attn_implementation="eager")
    with pytest.raises(ValueError, match="runs attention 'eager'; expected 'sdpa'"):
        use_packed_gqa(model)


@on_the_interpreter
def test_no_mask_runs_the_split_kernel_over_every_key(monkeypatch):
    calls = kernel_calls(monkeypatch)

    class M:
        num_key_value_groups = 2

    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, h, s, 16, generator=gen) for h, s in ((4, 1), (2, 40), (2, 40)))
    out, _ = packed_gqa_attention(M(), q, k, v, None)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1))
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=2e-5, atol=2e-5)
    assert len(calls) == 1 and calls[0] is None  # the kernel, with no mask


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["inductor", None])
def test_packed_gqa_on_the_gpu(backend):
    """bf16 tiny Llama (8 query heads on 2 key / value heads, D = 64) on the GPU, a static cache, compiled with
    inductor or eager: the same sequence of decode steps (three run directly, then two replays of a captured step)
    through the split kernel and through sdpa gives the same logits. transformers 5.24's StaticCache appends at a
    device-side counter, so every step and every replay is the next position: eager and replayed steps are compared
    model against model, not with each other."""
    config, model = tiny(seed=2, hidden_size=512, num_attention_heads=8, num_key_value_heads=2, intermediate_size=256)
    model = model.to("cuda", torch.bfloat16)
    packed = use_packed_gqa(copy.deepcopy(model))
    prompt = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(7)).cuda()

    def run(m):
        torch._dynamo.reset()
        cache = transformers.StaticCache(config=m.config, max_cache_len=60)
        fwd = torch.compile(m, backend=backend, dynamic=False) if backend else m
        with torch.no_grad():
            fwd(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(40, device="cuda"), use_cache=True)
            ids = torch.tensor([[3], [11]], device="cuda")
            pos = torch.tensor([40], device="cuda")

            def step():
                return fwd(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True).logits[:, -1]

            logits = [step().float() for _ in range(3)]
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = step()
            for _ in range(2):
                out.fill_(float("nan"))
                graph.replay()
                torch.cuda.synchronize()
                logits.append(out.float())
            return logits

    ref, got = run(model), run(packed)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert not g.isnan().any(), f"step {i}"
        # seen 0.0078 apart on an H200 (one bf16 ulp of the largest logit, ~1.5); consecutive steps differ by ~0.07
        torch.testing.assert_close(g, r, rtol=3e-2, atol=3e-2, msg=lambda m: f"step {i}: {m}")
    # the steps differ from each other (each attends one key more), so the comparison is not of a constant
    assert (ref[0] - ref[4]).abs().max() > 1e-2
