"""`kernels.decode_attention` (split along the keys) against fp64 torch: ragged cache lengths, chunks with no key kept,
strided caches, every float dtype; bad operands refused by name."""

import pytest
import torch

from blockscaled.kernels.decode_attention import decode_attention, decode_attention_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2, torch.float16: 2e-3}


def operands(B, HKV, G, D, S, dtype, gen, cache=None):
    q = torch.randn(B, HKV, G, D, generator=gen).to(DEVICE, dtype)
    # a static cache longer than S, sliced: the kernel reads strided k and v
    full = cache or S
    k = torch.randn(B, HKV, full, D, generator=gen).to(DEVICE, dtype)[:, :, :S]
    v = torch.randn(B, HKV, full, D, generator=gen).to(DEVICE, dtype)[:, :, :S]
    return q, k, v


@pytest.mark.parametrize("B,HKV,G,D,S,dtype", [(1, 2, 4, 16, 70, torch.float32), (2, 2, 2, 32, 33, torch.bfloat16),
                                               (3, 1, 8, 16, 129, torch.float16), (1, 1, 2, 16, 5, torch.float32),
                                               (1, 1, 32, 64, 300, torch.float32),
                                               # G not a power of two (Qwen2.5-7B's 7, Qwen2.5-32B's 5, Mistral-Large's
                                               # 12, 24): the padded query rows are masked, never stored
                                               (1, 2, 7, 16, 70, torch.float32), (2, 1, 5, 32, 33, torch.bfloat16),
                                               (1, 1, 12, 16, 40, torch.float16), (1, 1, 24, 16, 30, torch.float32)])
def test_equals_the_reference(B, HKV, G, D, S, dtype, gen):
    """Against fp64, called twice with different queries as a model's layers call it (a second call's output must
    not be the first's, left in memory the allocator hands out again)."""
    q, k, v = operands(B, HKV, G, D, S, dtype, gen, cache=S + 9)
    lengths = torch.randint(1, S + 1, (B,), generator=gen)
    lengths[0] = S
    keep = (torch.arange(S)[None, :] < lengths[:, None]).to(DEVICE)
    for query in (q, q * 3):
        out = decode_attention(query, k, v, keep)
        ref = decode_attention_reference(query, k, v, keep)
        assert out.shape == q.shape and out.dtype == dtype and not out.isnan().any()
        torch.testing.assert_close(out.double(), ref.double(), rtol=TOL[dtype], atol=TOL[dtype])


def test_keys_kept_only_in_one_chunk_and_scattered(gen):
    """Most chunks keep no key (their partials are -inf / 0 and weigh nothing); keep need not be a prefix."""
    q, k, v = operands(1, 2, 4, 16, 200, torch.float32, gen)
    keep = torch.zeros(1, 200, dtype=torch.bool, device=DEVICE)
    keep[0, [3, 150, 151, 199]] = True
    torch.testing.assert_close(decode_attention(q, k, v, keep, scale=0.3),
                               decode_attention_reference(q, k, v, keep, scale=0.3).float(), rtol=2e-5, atol=2e-5)
    # scores far below zero: the merge's weights are relative to the largest chunk maximum, not to 0
    torch.testing.assert_close(decode_attention(q * 40, k, v, keep), decode_attention_reference(q * 40, k, v, keep).float(),
                               rtol=2e-5, atol=2e-5)


def test_a_4d_mask_as_transformers_passes_it(gen):
    """keep [B or 1, 1, 1, S] (a step's mask, passed whole so that inductor makes it once) attends the keys its
    [B, S] view names: the same output as that view, per row of the batch or one row for all."""
    q, k, v = operands(2, 2, 4, 16, 40, torch.float32, gen)
    keep = torch.rand(2, 40, generator=gen).to(DEVICE) < 0.7
    keep[:, 0] = True
    want = decode_attention(q, k, v, keep)
    torch.testing.assert_close(decode_attention(q, k, v, keep[:, None, None, :]), want, rtol=0, atol=0)
    torch.testing.assert_close(want.double(), decode_attention_reference(q, k, v, keep).double(), rtol=2e-5, atol=2e-5)
    one = keep[:1, None, None, :]
    torch.testing.assert_close(decode_attention(q, k, v, one), decode_attention(q, k, v, one[:, 0, 0].expand(2, 40)),
                               rtol=0, atol=0)
    torch.testing.assert_close(decode_attention_reference(q, k, v, one), decode_attention_reference(
        q, k, v, one[:, 0, 0].expand(2, 40)), rtol=0, atol=0)
    for bad in (keep[:, None, :, None].expand(2, 1, 40, 40), keep[:, None, None, :].expand(2, 2, 1, 40),
                torch.ones(3, 1, 1, 40, dtype=torch.bool, device=DEVICE)):
        with pytest.raises(ValueError, match=r"keep: a bool \[B, S\] = \[2, 40\] or \[B or 1, 1, 1, S\]"):
            decode_attention(q, k, v, bad)


@pytest.mark.parametrize("bad,match", [
    (lambda q, k, v, m: (q[..., :8], k[..., :8], v[..., :8], m), r"G = 4 and D = 8: G >= 2 .* D a power of two >= 16"),
    (lambda q, k, v, m: (q[..., :2, :12], k[..., :12], v[..., :12], m), "G = 2 and D = 12: G >= 2 .* D a power of two"),
    (lambda q, k, v, m: (q[..., :1, :], k, v, m), r"G = 1 and D = 16: G >= 2 \(grouped heads\)"),
    (lambda q, k, v, m: (q, k[:, :1], v[:, :1], m), "does not match q"),
    (lambda q, k, v, m: (q, k, v.double(), m), "one dtype expected"),
    (lambda q, k, v, m: (q, k, v, m.float()), "keep: a bool"),
    (lambda q, k, v, m: (q, k[:, :, :1], v[:, :, :1], m[:, :1]), "S = 1: at least 2 keys"),
    (lambda q, k, v, m: (q, k, v, m[:, :-1]), "keep: a bool"),
])
def test_bad_operands_are_refused_by_name(bad, match, gen):
    q, k, v = operands(1, 2, 4, 16, 20, torch.float32, gen)
    keep = torch.ones(1, 20, dtype=torch.bool, device=DEVICE)
    with pytest.raises(ValueError, match=match):
        decode_attention(*bad(q, k, v, keep))


def test_cpu_operands_without_the_interpreter_and_mixed_devices_are_refused(gen, monkeypatch):
    """`supported` names CPU operands where kernels are compiled (Triton's launcher would fail naming none), and
    operands on different devices; `blockscaled.attention` then leaves the step to SDPA."""
    q, k, v = (t.cpu() for t in operands(1, 2, 4, 16, 20, torch.float32, gen))
    keep = torch.ones(1, 20, dtype=torch.bool)
    with pytest.raises(ValueError, match="q, k, v, keep on one device expected, got cpu, cpu, meta, cpu"):
        decode_attention(q, k, v.to("meta"), keep)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="q: on cpu; the kernels run on a CUDA GPU"):
        decode_attention(q, k, v, keep)


@pytest.mark.gpu
def test_llama3_8b_decode_shape_gpu(gen):
    """Llama-3-8B's decode step on the GPU: 8 key / value heads of 4 query heads, a 2124-key static cache of which
    2100 are filled, bf16."""
    q, k, v = operands(1, 8, 4, 128, 2124, torch.bfloat16, gen)
    keep = (torch.arange(2124) < 2100)[None, :].to(DEVICE)
    torch.testing.assert_close(decode_attention(q, k, v, keep).double(),
                               decode_attention_reference(q, k, v, keep).double(), rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
def test_qwen2_5_7b_decode_shape_gpu(gen):
    """Qwen2.5-7B's decode step: 4 key / value heads of 7 query heads (padded to 16 rows), a 2124-key cache of which
    2100 are filled, bf16, batch 1 and 3."""
    for batch in (1, 3):
        q, k, v = operands(batch, 4, 7, 128, 2124, torch.bfloat16, gen)
        keep = (torch.arange(2124) < 2100)[None, :].expand(batch, 2124).to(DEVICE)
        torch.testing.assert_close(decode_attention(q, k, v, keep).double(),
                                   decode_attention_reference(q, k, v, keep).double(), rtol=1e-2, atol=1e-2)


def test_compiles_for_sm90_without_spills(tmp_path, capfd):
    """Both kernels at Llama-3-8B's decode shape through Triton's sm_90 compiler (no GPU): no spills, and at most 128
    registers a thread for the partials (4 programs of 4 warps an SM, the split's aim)."""
    from bench import attention

    assert attention.main(["--compile-sm90", str(tmp_path)]) == 0
    out = capfd.readouterr().out  # (a child process without the Triton interpreter compiles)
    rows = {line.split()[0]: line for line in out.splitlines() if "sm_90:" in line}
    assert set(rows) == {"_partials_kernel", "_merge_kernel"}, out
    for line in rows.values():
        assert " 0 spilled" in line, line
    assert int(rows["_partials_kernel"].split("sm_90: ")[1].split()[0]) <= 128, out


@pytest.mark.gpu
def test_each_call_reads_the_one_before_gpu(gen):
    """Both kernels launch with PDL on sm_90+ and may start while the kernel before them ends: a chain where each
    call's query is the call before's output (and the cache row a copy of it, written by torch in between), eagerly
    and replayed in a CUDA graph, each output against fp64 on the inputs that call saw."""
    q, k, v = operands(1, 8, 4, 128, 700, torch.bfloat16, gen)
    keep = (torch.arange(700) < 650)[None, :].to(DEVICE)

    def chain(q0, steps=6):
        outs = [q0]
        for i in range(steps):
            out = decode_attention(outs[-1], k, v, keep)
            k[:, :, i] = out[:, :, 0]  # a torch kernel between two calls
            outs.append(out)
        return outs

    def restored():
        """The cache as it was before any call of a chain."""
        cache = k.clone()
        for i, row in enumerate(saved):
            cache[:, :, i] = row
        return cache

    def check(outs):
        kk = restored()
        for i in range(1, len(outs)):
            want = decode_attention_reference(outs[i - 1], kk, v, keep).double()
            torch.testing.assert_close(outs[i].double(), want, rtol=1e-2, atol=1e-2)
            kk[:, :, i - 1] = outs[i][:, :, 0]

    saved = [k[:, :, i].clone() for i in range(6)]
    check(chain(q))
    k.copy_(restored())
    graph = torch.cuda.CUDAGraph()
    static_q = q.clone()
    with torch.cuda.graph(graph):
        outs = chain(static_q)
    for scale in (2.0, 0.5):
        k.copy_(restored())
        static_q.copy_(q * scale)
        for out in outs[1:]:
            out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(outs)


@pytest.mark.gpu
@pytest.mark.parametrize("G", [4, 7])
def test_two_threads_two_streams_and_a_graph_gpu(gen, G):
    """Concurrent calls share nothing: two threads on their own streams with different caches, and a captured call
    replayed beside them, each equal to its reference (G = 7: rows padded to 16 and masked)."""
    import threading

    cases = [operands(1, 8, G, 128, 1000 + 37 * i, torch.bfloat16, gen) for i in range(3)]
    keeps = [(torch.arange(1000 + 37 * i) < 900 + 10 * i)[None, :].to(DEVICE) for i in range(3)]
    refs = [decode_attention_reference(*c, keep).double() for c, keep in zip(cases, keeps)]
    graph = torch.cuda.CUDAGraph()
    decode_attention(*cases[2], keeps[2])  # compiled before the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = decode_attention(*cases[2], keeps[2])
    results, errors = {}, []

    def worker(i):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(20):
                    results[i] = decode_attention(*cases[i], keeps[i])
            stream.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for _ in range(20):
        graph.replay()
    for t in threads:
        t.join()
    torch.cuda.synchronize()
    assert not errors, errors
    for i in range(2):
        torch.testing.assert_close(results[i].double(), refs[i], rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(captured.double(), refs[2], rtol=1e-2, atol=1e-2)
