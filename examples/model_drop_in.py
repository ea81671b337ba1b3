"""A transformers Llama with its linears swapped for nvfp4 weights (`blockscaled.nn.quantize_model_`), as a user drops
the layers into a model: quantized on the host, moved to the device, every layer checked against the fp64 reference
of its own codes, greedy tokens beside the unquantized model's, a state_dict round trip. Random weights, nothing
downloaded (`python -m bench.model` times the same at Llama-3-8B's size).

    python examples/model_drop_in.py
"""

import copy
import io

import torch
import transformers
from _common import DEVICE

from blockscaled.nn import QuantizedLinear, quantize_model_
from blockscaled.reference import max_rel_err, scaled_mm as reference

big = DEVICE == "cuda"
config = transformers.LlamaConfig(hidden_size=1024 if big else 64, intermediate_size=2816 if big else 128,
                                  num_hidden_layers=2, num_attention_heads=8 if big else 4, num_key_value_heads=2,
                                  vocab_size=2048 if big else 256)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(config).eval()  # fp32, on the host
quantized = copy.deepcopy(model)
report = quantize_model_(quantized, "nvfp4", filter_fn=lambda name, m: name != "lm_head")  # the lm_head stays, as
print({name: why for name, why in report.items() if not why.startswith("quantized")})      # serving engines keep it
model.to(DEVICE), quantized.to(DEVICE)  # the layers follow the move, into the device's weight layout

errs = []  # each layer's output on the input it saw, against fp64 of the same codes (the activation in bf16)
hooks = [m.register_forward_hook(lambda m, i, y: errs.append(max_rel_err(
    y.reshape(-1, m.out_features), reference(i[0].reshape(-1, m.in_features).to(torch.bfloat16), m.weight))))
    for m in quantized.modules() if isinstance(m, QuantizedLinear)]
prompt = torch.randint(0, config.vocab_size, (1, 12), device=DEVICE)
with torch.no_grad():
    logits = quantized(prompt).logits
for h in hooks:
    h.remove()
print(f"{len(errs)} quantized layers ({next(m for m in quantized.modules() if isinstance(m, QuantizedLinear))}): "
      f"max_rel_err vs fp64 {max(errs):.2e}")

with torch.no_grad():
    ours = quantized.generate(prompt, max_new_tokens=6, do_sample=False)[0, 12:].tolist()
    theirs = model.generate(prompt, max_new_tokens=6, do_sample=False)[0, 12:].tolist()
print(f"greedy tokens, nvfp4 {ours}, fp32 {theirs} (random weights: agreement says little)")

buffer = io.BytesIO()
torch.save(quantized.state_dict(), buffer)
buffer.seek(0)
again = copy.deepcopy(model)
quantize_model_(again, "nvfp4", filter_fn=lambda name, m: name != "lm_head")
again.load_state_dict(torch.load(buffer, weights_only=False))


def same(x, y) -> bool:
    """Tensors bit for bit, the layers' extra state (dicts) key by key."""
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    return x == y


assert same(quantized.state_dict(), again.state_dict()), "state_dict round trip"
# Split-K parts add into fp32 with atomics in whatever order they arrive (the README's "Reproducibility"): a layer's
# output may differ in its last bits from one call to the next, and where that flips the rounding of the next layer's
# bf16 input, the difference grows through the model. So each reloaded layer is held to its original on one input.
with torch.no_grad():
    errs = []
    for name, layer in quantized.named_modules():
        if isinstance(layer, QuantizedLinear):
            x = torch.randn(12, layer.in_features, device=DEVICE)  # fp32 out: no output rounding to flip
            errs.append(max_rel_err(again.get_submodule(name)(x), layer(x)))
    rerun, reloaded = quantized(prompt).logits, again(prompt).logits
assert max(errs) <= 1e-5, f"state_dict round trip: a reloaded layer's max_rel_err {max(errs):.2e}"
print(f"state_dict round trip: the same codes and scales, each layer's output within {max(errs):.1e}; logits "
      f"max_rel_err reloaded {max_rel_err(reloaded, logits):.1e}, the same model twice {max_rel_err(rerun, logits):.1e}")
