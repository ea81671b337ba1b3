"""`blockscaled.nn`: nn.Linear with block-scaled weights (and optionally activations quantized in each call).

    layer = QuantizedLinear.from_linear(linear, weight_format="nvfp4")                         # W4A16
    layer = QuantizedLinear.from_linear(linear, weight_format="nvfp4", activation_format="nvfp4")  # W4A4
    report = quantize_model_(model, weight_format="mxfp4")   # every eligible nn.Linear, in place; q / k / v and
                                                             # gate / up as one layer each
    report = quantize_model_(model, "nvfp4", fuse_projections=False)  # each projection its own layer
    # transformers 5's 3-D mixture-of-experts weights (Mixtral, Qwen MoE, gpt-oss): a QuantizedExperts
    with calibrate(model) as scales:                         # static nvfp4 activation scales from data
        for batch in batches: model(batch)

| input       | nn.Linear's contract: [..., K], any leading dimensions, any strides, bf16 / fp16 / fp32 |
| output      | [..., N] in the input's dtype                                                        |
| weights     | a `QTensor` in the device's layout (`quantize_weight`); state_dict as tensors + extra state |
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math

import torch
from torch import nn

from blockscaled.reference.quantize import nvfp4_global_scale

from .formats import get_format
from .ops import linear_call, linear_eager, register_weight
from .qtensor import QTensor
from .weights import quantize_weight

_FLOATS = (torch.bfloat16, torch.float16, torch.float32)


class QuantizedLinear(nn.Module):
    """y = x @ dequant(W)^T (+ bias) through `blockscaled.scaled_mm`; with `activation_format` the activation is
    quantized in every call (`scaled_mm`'s `activation_format`, `scale_rounding`, `activation_global_scale`)."""

    def __init__(self, weight: QTensor, bias: torch.Tensor | None = None, *, activation_format: str | None = None,
                 scale_rounding: str = "floor", activation_global_scale: float | None = None):
        super().__init__()
        if not isinstance(weight, QTensor):
            raise TypeError(f"weight: expected a QTensor [out_features, in_features], got {type(weight).__name__}")
        if activation_format is not None and not get_format(activation_format).is_scaled:
            raise ValueError(f"activation_format: expected 'nvfp4', 'mxfp4', 'mxfp8' or None, got {activation_format!r}")
        from blockscaled.kernels import SUPPORTED_PAIRS

        if (activation_format or "bf16", weight.fmt.name) not in SUPPORTED_PAIRS:
            pairs = ", ".join(f"{a} x {b}" for a, b in SUPPORTED_PAIRS if a != "bf16")
            raise ValueError(f"activation_format: {activation_format} activations on {weight.fmt.name} weights are not "
                             f"supported; supported pairs: {pairs}")
        self.out_features, self.in_features = weight.shape
        self.activation_format, self.scale_rounding = activation_format, scale_rounding
        self._set_weight(weight)
        self.activation_global_scale = activation_global_scale
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @property
    def activation_global_scale(self) -> float | None:
        """The static nvfp4 activation scale (None: each call's amax). Kept beside as a float32 [1] buffer on the
        weight's device, which the calls take: a number would be copied to the device in every call (a host sync, and
        refused inside a CUDA-graph capture)."""
        return self._activation_global_scale

    @activation_global_scale.setter
    def activation_global_scale(self, value: float | None) -> None:
        if value is not None:
            value = float(value)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"activation_global_scale: expected a finite number > 0 or None, got {value}")
        self._activation_global_scale = value
        self.register_buffer("activation_scale", None if value is None else torch.full(
            (1,), value, dtype=torch.float32, device=self.weight_data.device), persistent=False)

    def _weight_from_buffers(self, fmt, layout: str, shape, data_layout: str) -> QTensor:
        """The QTensor the code buffers hold (after a state_dict load or a move replaced them)."""
        return QTensor(self.weight_data, self.weight_scale, fmt, layout, self.weight_global_scale, tuple(shape),
                       data_layout)

    def _set_weight(self, weight: QTensor) -> None:
        self.weight = weight
        register_weight(weight)
        for name in ("data", "scale", "global_scale"):  # tensors in the state_dict; the rest in the extra state
            self.register_buffer(f"weight_{name}", getattr(weight, name), persistent=True)

    @classmethod
    def from_linear(cls, linear: nn.Linear, weight_format: str, *, activation_format: str | None = None,
                    scale_rounding: str = "floor", data_layout: str | None = None, **quantize_options) -> QuantizedLinear:
        """`linear`'s weight quantized once (`quantize_weight`, on its device: the device's fastest layout unless
        `data_layout` is given), its bias kept."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        block = get_format(weight_format).block_size
        if linear.in_features % block:  # (else the quantizer's message would name its own argument, x)
            raise ValueError(f"linear: in_features = {linear.in_features} must be a multiple of the {weight_format} "
                             f"block size {block}")
        return cls.from_weight(linear.weight, weight_format, bias=linear.bias, activation_format=activation_format,
                               scale_rounding=scale_rounding, data_layout=data_layout, **quantize_options)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, weight_format: str, *, bias: torch.Tensor | None = None,
                    activation_format: str | None = None, scale_rounding: str = "floor", data_layout: str | None = None,
                    **quantize_options) -> QuantizedLinear:
        """A layer of a float weight [out_features, in_features] (as `from_linear` of an nn.Linear holding it)."""
        q = quantize_weight(weight.detach(), weight_format, data_layout=data_layout, **quantize_options)
        layer = cls(q, bias, activation_format=activation_format, scale_rounding=scale_rounding)
        layer.follow_device_layout = data_layout is None
        return layer

    # the codes and scales: a move changes their device, never their dtype
    _CODE_BUFFERS = ("weight_data", "weight_scale", "weight_global_scale", "activation_scale")
    # re-arrange the weights for the device a move lands on (`from_linear` without a `data_layout` sets it)
    follow_device_layout = False

    def _apply(self, fn, recurse=True):
        """`.to(device)` / `.cuda()` move the codes and scales; dtype casts (`model.to(torch.bfloat16)`, `.half()`)
        leave them as they are (a cast would turn the fp8 codes and scales into other numbers) and cast the bias, as
        nn.Linear's. The weight is then rebuilt from the moved buffers, in the device's fastest layout where
        `follow_device_layout` (a model quantized on the host and moved to the GPU gets the GPU's kernels)."""
        before = {name: getattr(self, name) for name in self._CODE_BUFFERS}
        super()._apply(fn, recurse)
        for name, old in before.items():
            new = getattr(self, name)
            if old is not None and new is not None and new.dtype != old.dtype:
                setattr(self, name, old.to(new.device))
        w = self.weight
        weight = self._weight_from_buffers(w.fmt, w.layout, w.shape, w.data_layout)
        if all(getattr(weight, f) is getattr(w, f) for f in ("data", "scale", "global_scale")):
            return self  # nothing moved: keep the weight and its caches
        # from the meta device (`to_empty`) there are no codes to arrange yet: a state_dict brings them
        arrange = self.follow_device_layout and w.data.device.type != "meta"
        self._set_weight(weight.for_device() if arrange else weight)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS:
            raise TypeError(f"x: expected a bf16, fp16 or fp32 tensor, got {getattr(x, 'dtype', type(x).__name__)}")
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected [..., in_features = {self.in_features}], got shape {tuple(x.shape)}")
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if self.activation_format is None and x2.dtype != torch.bfloat16:
            x2 = x2.to(torch.bfloat16)
        x2 = x2.contiguous()
        # while torch.compile traces, the custom op (one node, its fake implementation); eager, the call itself
        call = linear_call if torch.compiler.is_compiling() else linear_eager
        y = call(x2, self.weight, self.bias, self.activation_format, self.scale_rounding, self.activation_scale,
                 x.dtype)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def get_extra_state(self) -> dict:
        w = self.weight
        return dict(fmt=w.fmt.name, layout=w.layout, shape=tuple(w.shape), data_layout=w.data_layout,
                    activation_format=self.activation_format, scale_rounding=self.scale_rounding,
                    activation_global_scale=self.activation_global_scale)

    def set_extra_state(self, state: dict) -> None:
        weight = self._weight_from_buffers(get_format(state["fmt"]), state["layout"], state["shape"],
                                           state["data_layout"])
        self.activation_format, self.scale_rounding = state["activation_format"], state["scale_rounding"]
        self.activation_global_scale = state["activation_global_scale"]
        self.out_features, self.in_features = weight.shape
        self.weight = weight
        register_weight(weight)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # the stored tensors may differ in shape from this module's (another layer size, another data layout):
        # take them as they are, then rebuild the QTensor from them and the extra state
        for name in ("data", "scale", "global_scale"):
            key = f"{prefix}weight_{name}"
            setattr(self, f"weight_{name}", state_dict[key] if key in state_dict else None)
        if f"{prefix}bias" in state_dict:
            self.bias = nn.Parameter(torch.empty_like(state_dict[f"{prefix}bias"]), requires_grad=False)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        w = self.weight
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"weight_format={w.fmt.name}, data_layout={w.data_layout}, activation_format={self.activation_format}")


# Sibling projections that read one input, in the order a decoder layer calls them (Llama, Qwen2, Mistral: attention
# and MLP; Mixtral's experts), and the name the fused layer takes beside them.
FUSED_PROJECTIONS = ((("q_proj", "k_proj", "v_proj"), "qkv_proj"), (("gate_proj", "up_proj"), "gate_up_proj"),
                     (("w1", "w3"), "w13"))


class FusedProjections(nn.Module):
    """Sibling projections of one input as one `QuantizedLinear` (`linear`, their weights stacked along N): one kernel
    where a decoder layer runs two or three (bf16 x nvfp4 at batch 1 on an H200, each shape timed alone: Llama-3-8B's
    q / k / v 5.7 us as one 6144 x 4096 layer, 5.0 + 2 x 2.9 us as three). Each sibling is a `ProjectionSlice` that
    returns its columns of the fused output; the first sibling called with an input runs the layer, the others take
    its output until each has taken it once (`take`: another tensor, one written in place since, or another stream
    runs it again)."""

    def __init__(self, linear: QuantizedLinear, names: tuple[str, ...], sizes: tuple[int, ...]):
        super().__init__()
        self.linear, self.names, self.sizes = linear, names, sizes
        self._stash = None  # (input, output, the siblings that took it, (the input's version, the current stream))

    def take(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Sibling `index`'s columns of the fused layer's output on `x`: the stashed output where it is `x`'s, unwritten
        since and made on this stream (another thread's stream may not have it yet), else a new run. While
        torch.compile traces, the identity of `x` alone decides (an in-place write to it between two siblings inside
        one traced graph would not be seen; transformers' layers make none)."""
        stash = self._stash
        when = None if torch.compiler.is_compiling() else (
            x._version, torch._C._cuda_getCurrentRawStream(x.device.index) if x.is_cuda else None)
        if stash is None or stash[0] is not x or index in stash[2] or stash[3] != when:
            stash = (x, self.linear(x), (), when)
        taken = stash[2] + (index,)
        self._stash = None if len(taken) == len(self.names) else (stash[0], stash[1], taken, stash[3])
        start = sum(self.sizes[:index])
        return stash[1][..., start:start + self.sizes[index]]

    def extra_repr(self) -> str:
        return f"projections={', '.join(f'{n} ({s})' for n, s in zip(self.names, self.sizes))}"


class ProjectionSlice(nn.Module):
    """One projection of a `FusedProjections`: its columns of the fused layer's output, a view (as serving engines'
    fused layers give; `.contiguous()` where a caller needs it)."""

    def __init__(self, fused: FusedProjections, index: int):
        super().__init__()
        object.__setattr__(self, "fused", fused)  # the parent holds it as a submodule; here only a reference
        self.index = index
        self.in_features, self.out_features = fused.linear.in_features, fused.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.take(self.index, x)

    def extra_repr(self) -> str:
        return f"{self.fused.names[self.index]} of the fused layer: out_features={self.out_features}"


def install_fused(parent: nn.Module, prefix: str, names: tuple[str, ...], fused_name: str, layer: QuantizedLinear,
                  sizes: tuple[int, ...], report: dict, verb: str) -> None:
    """`layer` (the siblings `names` of `parent` stacked, `sizes` rows each) registered as `parent.fused_name`, each
    sibling replaced by its `ProjectionSlice`; report[sibling] = f"{verb}, fused into {prefix}{fused_name}"."""
    fused = FusedProjections(layer, names, sizes)
    setattr(parent, fused_name, fused)
    for i, n in enumerate(names):
        setattr(parent, n, ProjectionSlice(fused, i))
        report[prefix + n] = f"{verb}, fused into {prefix}{fused_name}"


class QuantizedExperts(nn.Module):
    """A mixture of experts' weights as transformers 5 stores them, 3-D, as two `QuantizedLinear` per expert.

    | layout (the class's flags)        | gate_up_proj | down_proj | biases                     | gating          |
    |-----------------------------------|--------------|-----------|----------------------------|-----------------|
    | default (Mixtral, Qwen2 / 3 MoE)  | [E, 2I, H]   | [E, H, I] | none                       | act(gate) * up  |
    | is_transposed, has_bias (gpt-oss) | [E, H, 2I]   | [E, I, H] | gate_up_proj_bias [E, 2I], | the class's own |
    |                                   |              |           | down_proj_bias [E, H]      |                 |

    The forward is transformers' eager experts loop (each routed token's rows through its experts, gated, weighted,
    summed), each product one `scaled_mm` of an expert the tokens chose (batch 1: top-k calls of M = 1); the gating is
    the experts class's `_apply_gate` (gpt-oss: interleaved halves, clamped), kept with its settings in `gating`. The
    loop reads the routing on the host, as transformers' eager loop does. While `torch.compile` traces or a CUDA graph
    captures, which cannot wait on the host, every expert runs on every token instead and its rows are weighted by
    the routing (0 where a token chose another expert; `every_expert`): no graph break, fullgraph=True compiles, and
    the decode step captures, at the cost of every expert's weights read (E / top_k times the loop's at decode; at
    prefill, where the tokens choose every expert anyway, E / top_k times its FLOPs)."""

    _WEIGHTS = ("gate_up_proj", "down_proj", "gate_up_proj_bias", "down_proj_bias")

    def __init__(self, gate_up: list[QuantizedLinear], down: list[QuantizedLinear], gating: nn.Module):
        super().__init__()
        self.gate_up, self.down, self.gating = nn.ModuleList(gate_up), nn.ModuleList(down), gating
        self.num_experts = len(gate_up)

    @staticmethod
    def supported(module: nn.Module, block: int = 1) -> str | None:
        """None where `module` is a transformers experts module of a layout above whose hidden and intermediate sizes
        are multiples of `block` (the formats' K block), else why not."""
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if not (isinstance(gate_up, nn.Parameter) and isinstance(down, nn.Parameter)
                and gate_up.dim() == down.dim() == 3):
            return "not 3-D gate_up_proj / down_proj experts"
        routed = [p for p in inspect.signature(type(module).forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(routed) != 4:  # self, the hidden states, the experts chosen, their weights (Llama 4's takes the states)
            return "experts forward not (hidden_states, top_k_index, top_k_weights)"
        flags = {a: getattr(module, a, d) for a, d in (
            ("has_gate", True), ("has_bias", False), ("is_transposed", False), ("is_concatenated", True),
            ("has_post_expert_norm", False))}
        e, h, two_i = (gate_up.shape[0], *gate_up.shape[1:]) if flags["is_transposed"] else (
            gate_up.shape[0], gate_up.shape[2], gate_up.shape[1])
        want_down = (e, two_i // 2, h) if flags["is_transposed"] else (e, h, two_i // 2)
        apply_gate = getattr(type(module), "_apply_gate", None)
        own_gate = apply_gate is not None and apply_gate is not _transformers_apply_gate()
        biases = [getattr(module, n, None) for n in ("gate_up_proj_bias", "down_proj_bias")]
        if (not flags["has_gate"] or flags["has_post_expert_norm"] or tuple(down.shape) != want_down
                or (not flags["is_concatenated"] and not own_gate) or (not own_gate and not hasattr(module, "act_fn"))
                or (flags["has_bias"] and [getattr(b, "shape", None) for b in biases] != [(e, two_i), (e, h)])):
            return (f"experts layout not supported ({flags}; gate_up_proj {tuple(gate_up.shape)}, down_proj "
                    f"{tuple(down.shape)}: expected the default or transformers' gpt-oss layout)")
        if h % block or two_i // 2 % block:
            return f"hidden {h} or intermediate {two_i // 2} is not a multiple of the block {block}"
        return None

    @classmethod
    def from_experts(cls, module: nn.Module, weight_format: str, **options) -> QuantizedExperts:
        """`module`'s experts quantized one matrix at a time (`QuantizedLinear.from_weight`; options as its); `module`
        itself is left as it was (its gating settings are copied)."""
        transposed, biased = getattr(module, "is_transposed", False), getattr(module, "has_bias", False)

        def layers(weights, biases):
            return [QuantizedLinear.from_weight(w.t() if transposed else w, weight_format,
                                                bias=None if biases is None else biases[i], **options)
                    for i, w in enumerate(weights)]

        return cls(layers(module.gate_up_proj, module.gate_up_proj_bias if biased else None),
                   layers(module.down_proj, module.down_proj_bias if biased else None), cls.gating_of(module))

    @classmethod
    def gating_of(cls, module: nn.Module) -> nn.Module:
        """A copy of experts `module` without its weights: its class and settings (act_fn, gpt-oss's alpha / limit)."""
        gating = copy.copy(module)
        gating._parameters = {k: v for k, v in module._parameters.items() if k not in cls._WEIGHTS}
        gating._buffers, gating._modules = dict(module._buffers), dict(module._modules)
        return gating

    def gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        """The gated rows of one expert's gate_up output: the experts class's `_apply_gate`, else act(gate) * up."""
        apply_gate = getattr(type(self.gating), "_apply_gate", None)
        if apply_gate is not None:
            return apply_gate(self.gating, gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.gating.act_fn(gate) * up

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        if torch.compiler.is_compiling() or (hidden_states.is_cuda and torch.cuda.is_current_stream_capturing()):
            return self.every_expert(hidden_states, top_k_index, top_k_weights)
        final = torch.zeros_like(hidden_states)
        with torch.no_grad():  # [experts + 1, top_k, tokens]: index `num_experts` is padding (expert parallelism)
            mask = nn.functional.one_hot(top_k_index, num_classes=self.num_experts + 1).permute(2, 1, 0)
            hit = torch.greater(mask.sum(dim=(-1, -2)), 0).nonzero()
        for e in hit[:, 0].tolist():
            if e == self.num_experts:
                continue
            top_k_pos, token_idx = torch.where(mask[e])
            h = self.down[e](self.gate(self.gate_up[e](hidden_states[token_idx])))
            final.index_add_(0, token_idx, (h * top_k_weights[token_idx, top_k_pos, None]).to(final.dtype))
        return final

    def every_expert(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
        """The forward without a host read: each expert on every token, its rows times the weight the token gave it
        (`torch.where`: 0, not 0 x its output, where the token chose another expert)."""
        final = torch.zeros_like(hidden_states)
        for e in range(self.num_experts):
            chosen = top_k_index == e  # [tokens, top_k]; the padding index num_experts matches none
            weight = (top_k_weights * chosen).sum(dim=-1, keepdim=True)
            h = self.down[e](self.gate(self.gate_up[e](hidden_states)))
            final = final + torch.where(chosen.any(dim=-1, keepdim=True), h * weight, 0).to(final.dtype)
        return final

    def extra_repr(self) -> str:
        w = self.gate_up[0].weight
        return (f"num_experts={self.num_experts}, weight_format={w.fmt.name}, hidden={w.shape[1]}, "
                f"intermediate={w.shape[0] // 2}, gating={type(self.gating).__name__}")


def _transformers_apply_gate():
    """transformers' default `_apply_gate` (act_fn(gate) * up): a class with another gates otherwise (gpt-oss)."""
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:  # transformers < 5 keeps its experts as nn.Linear layers
        return None
    return _default_apply_gate


def _fusable(parent: nn.Module, prefix: str, names: tuple[str, ...], eligible) -> list[nn.Linear] | None:
    """The sibling nn.Linears of `parent` (named `prefix`) named `names`, where all are eligible (`eligible(name,
    module)`) and alike (input size, bias, dtype, device) so that one stacked layer computes them; else None."""
    linears = [getattr(parent, n, None) for n in names]
    if not all(type(m) is nn.Linear and eligible(prefix + n, m) for n, m in zip(names, linears)):
        return None
    first = linears[0]
    alike = all(m.in_features == first.in_features and (m.bias is None) == (first.bias is None)
                and m.weight.dtype == first.weight.dtype and m.weight.device == first.weight.device for m in linears)
    return linears if alike else None


def quantize_model_(model: nn.Module, weight_format: str, *, activation_format: str | None = None,
                    filter_fn=None, fuse_projections: bool = True, **options) -> dict[str, str]:
    """Replace every eligible nn.Linear of `model` in place by a `QuantizedLinear`; returns {name: "quantized" or
    why it was skipped}. Eligible: `filter_fn(name, module)` true (default: all) and in_features a multiple of the
    format's block (and, with `activation_format`, of its block too).

    `fuse_projections` (default on: Llama-3-8B compiled, batch 1, H200: 265.2 -> 292.1 tokens/s, 1.66x -> 1.82x bf16):
    sibling projections of one input (`FUSED_PROJECTIONS`: q / k / v, gate / up), where all are
    eligible and alike, become one `QuantizedLinear` over their stacked weights (`FusedProjections`, registered beside
    them as qkv_proj / gate_up_proj) and each a `ProjectionSlice` of it: one kernel instead of two or three. Their
    state_dict keys are then the fused layer's. nvfp4 weights then share one global scale, the stacked weight's (as
    serving checkpoints of fused layers do), so their codes can differ from those of separate layers; MX weights
    (per-block scales only) quantize to the same codes either way. The report says "quantized, fused into NAME".
    Siblings that read different inputs (cross-attention's k / v of the encoder's states) stay correct, but each then
    runs the whole stacked layer: leave them out with `filter_fn`.

    Mixture-of-experts weights that transformers 5 stores as 3-D parameters (an experts module's `gate_up_proj` /
    `down_proj`: Mixtral, Qwen MoE, gpt-oss) become a `QuantizedExperts` ("quantized experts"; its layout checked, else
    "skipped: ..." with the reason), under the same `filter_fn` (the experts module's name) and block rule."""
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn: expected a callable (name, module) -> bool or None, got {type(filter_fn).__name__}")
    blocks = [get_format(weight_format).block_size] + ([get_format(activation_format).block_size] if activation_format else [])
    report = {}

    def eligible(name, module):
        return (filter_fn is None or filter_fn(name, module)) and module.in_features % max(blocks) == 0

    if fuse_projections:
        for parent_name, parent in list(model.named_modules()):
            for names, fused_name in FUSED_PROJECTIONS:
                prefix = f"{parent_name}." if parent_name else ""
                linears = _fusable(parent, prefix, names, eligible)
                if linears is None or hasattr(parent, fused_name):
                    continue
                stacked = nn.Linear(linears[0].in_features, sum(m.out_features for m in linears),
                                    bias=linears[0].bias is not None, device="meta")
                stacked.weight = nn.Parameter(torch.cat([m.weight.detach() for m in linears]), requires_grad=False)
                if stacked.bias is not None:
                    stacked.bias = nn.Parameter(torch.cat([m.bias.detach() for m in linears]), requires_grad=False)
                layer = QuantizedLinear.from_linear(stacked, weight_format, activation_format=activation_format,
                                                    **options)
                install_fused(parent, prefix, names, fused_name, layer, tuple(m.out_features for m in linears), report,
                              "quantized")
    for name, module in list(model.named_modules()):
        if isinstance(getattr(module, "gate_up_proj", None), nn.Parameter) and module.gate_up_proj.dim() == 3:
            report[name] = _quantize_experts(model, name, module, blocks, filter_fn, weight_format,
                                             activation_format=activation_format, **options)
            continue
        if not isinstance(module, nn.Linear) or isinstance(module, QuantizedLinear):
            continue
        if filter_fn is not None and not filter_fn(name, module):
            report[name] = "skipped: filter_fn"
            continue
        if module.in_features % max(blocks):
            report[name] = f"skipped: in_features {module.in_features} is not a multiple of the block {max(blocks)}"
            continue
        replace_module(model, name, QuantizedLinear.from_linear(module, weight_format,
                                                                activation_format=activation_format, **options))
        report[name] = "quantized"
    return report


def replace_module(model: nn.Module, name: str, module: nn.Module) -> None:
    """`module` put in `model` at the dotted `name` (a submodule's), in place of the one there."""
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent), attr, module)


def _quantize_experts(model, name, module, blocks, filter_fn, weight_format, **options) -> str:
    """`module` (3-D experts at `name`) replaced by its `QuantizedExperts` in `model`; the report's word for it."""
    if filter_fn is not None and not filter_fn(name, module):
        return "skipped: filter_fn"
    why = QuantizedExperts.supported(module, max(blocks))
    if why:
        return f"skipped: {why}"
    replace_module(model, name, QuantizedExperts.from_experts(module, weight_format, **options))
    return "quantized experts"


@contextlib.contextmanager
def calibrate(model: nn.Module):
    """Static activation scales for the nvfp4-activation layers of `model`, from the inputs they see inside the block.

    Each `QuantizedLinear` with `activation_format="nvfp4"` runs as with a scale from every call's amax while it
    records the largest |x| it is given (on the device: no host sync per call); on leaving the block it takes
    `activation_global_scale = amax / (6 * 448)` (1.0 where every input was zero), the scale `reference.quantize`
    would derive from that amax, so later calls skip the amax pass (`scaled_mm`'s static `activation_global_scale`,
    as serving checkpoints carry `input_scale`). Inputs past the calibrated amax then saturate at the format's
    largest code. Yields {layer name: scale}, filled on exit; layers no call reached keep the scale they had and are
    left out. A NaN or Inf among a layer's inputs is an error naming the layer; so is an exception in the block (every
    layer then keeps its scale). Run it eagerly, before `torch.compile`."""
    layers = {name: m for name, m in model.named_modules()
              if isinstance(m, QuantizedLinear) and m.activation_format == "nvfp4"}
    saved = {name: m.activation_global_scale for name, m in layers.items()}
    amax: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, args, kwargs):
            x = args[0] if args else kwargs["x"]
            a = x.detach().abs().amax().to(torch.float32)
            amax[name] = a if name not in amax else torch.maximum(amax[name], a)
        return record

    handles = [m.register_forward_pre_hook(hook(name), with_kwargs=True) for name, m in layers.items()]
    scales: dict[str, float] = {}
    try:
        for m in layers.values():
            m.activation_global_scale = None
        yield scales
    finally:  # every layer's scale as it was (on an exception, a NaN, or for layers no call reached)
        for h in handles:
            h.remove()
        for name, m in layers.items():
            m.activation_global_scale = saved[name]
    seen = {name: float(a) for name, a in zip(amax, torch.stack(list(amax.values())).cpu())} if amax else {}
    bad = [name for name, a in seen.items() if not math.isfinite(a)]
    if bad:
        raise ValueError(f"calibrate: non-finite activations (NaN or Inf) reached {', '.join(bad)}; no scale was set")
    for name, a in seen.items():
        layers[name].activation_global_scale = scales[name] = float(nvfp4_global_scale(torch.tensor(a)))
