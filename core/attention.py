"""`blockscaled.attention`: grouped-query attention without `repeat_kv` in compiled decode steps.

    from blockscaled.attention import use_packed_gqa
    use_packed_gqa(model)          # a transformers model; then torch.compile / CUDA graphs as before

transformers' `sdpa` attention (5.24) packs a decode step's query heads onto their key / value heads (`pack_gqa`) only
when it is not being compiled; under `torch.compile` with a static cache it copies the whole cache 4x per step
(Llama-3-8B on an H200: `repeat_kv`, 0.43 ms of a 5.9 ms bf16 step), and SDPA on packed heads is no better there
(cuDNN ran one program per key / value head: 47 us a layer). This attention is `sdpa`'s but for one query token per
sequence, compiled or not: the G query heads of a key / value head become its G query rows ([B, H, 1, D] ->
[B, H / G, G, D]) and `blockscaled::decode_attention` (`kernels/decode_attention.py`) splits the keys over the GPU.

| query            | key / value                  | mask                                   | path                          |
|------------------|------------------------------|----------------------------------------|-------------------------------|
| [B, H, 1, D]     | [B, H / G, S, D], G > 1      | none, or bool [B or 1, 1, 1, S]        | `decode_attention`            |
| [B, H, 1, D]     | [B, H / G, S, D], G > 1      | float [B or 1, 1, 1, S]                | SDPA on the packed heads      |
| anything else    |                              |                                        | transformers' `sdpa`          |

G >= 2 query heads a key / value head (any count: Qwen2.5-7B's 7 too), D a power of two >= 16, at least 2 keys, and
no dropout for the first row (else the second). H200, Llama-3-8B's decode shape: 7.5 us a layer (9.0 with its two
kernels launched without PDL) against 39.4 for compiled sdpa (`python -m bench.attention`; Qwen2.5-7B's: 6.3); the
compiled 8B model 158.8 -> 183.6 tokens/s in bf16, 292.1 -> 371.5 with nvfp4 weights (`bench.model`, its default,
before PDL).
"""

from __future__ import annotations

import functools

import torch

from blockscaled.kernels.decode_attention import supported

NAME = "blockscaled_packed_gqa"


def packed_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """A transformers attention function (`AttentionInterface`): `sdpa_attention_forward`, with a decode step's query
    heads packed onto their key / value heads compiled too."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, q_length, dim = query.shape
    packable = (groups > 1 and q_length == 1 and key.shape[1] * groups == heads
                and (attention_mask is None or (attention_mask.dim() == 4 and attention_mask.shape[1:3] == (1, 1)))
                and all(kwargs.get(k) is None for k in ("position_bias", "softcap", "s_aux"))
                and not kwargs.get("output_attentions", False))
    if not packable:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    packed = query.reshape(batch, heads // groups, groups, dim)
    # a bool mask goes to the kernel whole ([B or 1, 1, 1, S]; `supported` checks its shape): its [B, S] view, made
    # here, was copied by inductor for each layer (one ~1 us kernel a layer on an H200)
    keep = attention_mask if attention_mask is not None and attention_mask.dtype == torch.bool else None
    scale = scaling if scaling is not None else dim ** -0.5
    if (keep is not None or attention_mask is None) and dropout == 0.0 and supported(packed, key, value, keep) is None:
        # split along the keys: SDPA's kernels run one program per head here (cuDNN's took 47 us a layer on an H200)
        out = torch.ops.blockscaled.decode_attention(packed, key, value, keep, float(scale))
    else:
        out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=attention_mask,
                                                               dropout_p=dropout, scale=scaling)
    # [B, H / G, G, Dv] -> [B, 1, H, Dv], as sdpa_attention_forward returns [B, q_length, H, Dv]
    return out.reshape(out.shape[0], 1, heads, value.shape[-1]), None


def _step_mask(make, *args, **kwargs):
    """`make`'s mask (transformers' `sdpa_mask`, made once a step and passed to every layer) through an op inductor
    cannot inline: inductor otherwise recomputes the cheap mask expression into a buffer for each layer's attention
    (the compiled 8B decode step on an H200: a ~1 us kernel a layer, 31 of them redundant). Decode steps' masks
    ([B, 1, 1, S]) only: a prefill's [B, 1, q, S] is left as it was (a copy would cost memory for little)."""
    mask = make(*args, **kwargs)
    decode = isinstance(mask, torch.Tensor) and mask.dim() == 4 and mask.shape[2] == 1
    return torch.ops.blockscaled.step_mask(mask) if decode else mask


def use_packed_gqa(model):
    """`model` (a transformers `PreTrainedModel` whose attention is `sdpa`) set to `packed_gqa_attention`, registered
    under `blockscaled.attention.NAME` with `sdpa`'s masks; returns `model`. Models on another attention (gpt-oss's
    eager one with its sinks, flash attention) are refused by name: this replaces `sdpa`, nothing else."""
    if getattr(model.config, "_attn_implementation", None) not in ("sdpa", NAME):
        raise ValueError(f"use_packed_gqa: {type(model).__name__} runs attention "
                         f"{getattr(model.config, '_attn_implementation', None)!r}; expected 'sdpa'")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, packed_gqa_attention)
    AttentionMaskInterface.register(NAME, functools.partial(_step_mask, sdpa_mask))
    model.set_attn_implementation(NAME)
    if model.config._attn_implementation != NAME:
        raise RuntimeError(f"use_packed_gqa: {type(model).__name__} kept attention {model.config._attn_implementation!r}")
    return model
