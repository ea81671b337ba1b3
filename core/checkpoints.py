"""`blockscaled.checkpoints`: quantized weights as published checkpoints store them, as QTensors and layers.

| format (`FORMATS` key)      | tensors of one linear (after its prefix)                            | elements                                   | block scales                         | global scales                                                       |
|-----------------------------|---------------------------------------------------------------------|--------------------------------------------|--------------------------------------|---------------------------------------------------------------------|
| "modelopt_nvfp4" (NVIDIA ModelOpt) | weight, weight_scale, weight_scale_2, input_scale (optional) | uint8 [N, K/2] E2M1 pairs, even K low nibble | float8_e4m3fn [N, K/16], row-major | weight_scale_2, input_scale: multipliers (ours as they are)          |
| "compressed_tensors_nvfp4" (`nvfp4-pack-quantized`) | weight_packed, weight_scale, weight_global_scale, input_global_scale (optional) | as ModelOpt | as ModelOpt | stored as divisors: ours = 1 / theirs                     |
| "gpt_oss_mxfp4"             | `<name>_blocks`, `<name>_scales`                                      | uint8 [N, K/32, 16] E2M1 pairs, even K low nibble | uint8 [N, K/32], E8M0 (2^(code - 127)) | none                                                    |

Checked against the published readers: vLLM's `break_fp4_bytes` (low nibble first) and its compressed-tensors
schemes (`weight_scale_2 = 1 / weight_global_scale`), ModelOpt's `weight * weight_scale * weight_scale_2`, gpt-oss's
`lut[blk & 0x0F]` for even K and `ldexp(., scales - 127)`.

    tensors = safetensors.torch.load_file("model.safetensors")
    layer = blockscaled.checkpoints.load_linear(tensors, "model.layers.0.mlp.down_proj.", "modelopt_nvfp4",
                                                activation_format="nvfp4", device="cuda")
    report = blockscaled.checkpoints.load_model_(model, tensors)   # every linear the file holds, format detected
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .formats import get_format
from .qtensor import QTensor

FORMATS = ("modelopt_nvfp4", "compressed_tensors_nvfp4", "gpt_oss_mxfp4")


def _get(tensors: Mapping, key: str) -> torch.Tensor:
    if key not in tensors:
        raise KeyError(f"tensors: no {key!r} (expected for this checkpoint format)")
    return tensors[key]


def _packed(t: torch.Tensor, key: str) -> torch.Tensor:
    if t.dtype not in (torch.uint8, torch.int8) or t.dim() != 2:
        raise ValueError(f"{key}: expected uint8 [N, K / 2] packed E2M1 pairs, got {t.dtype} {tuple(t.shape)}")
    return t.view(torch.uint8)


def _scalar(t: torch.Tensor, key: str, divisor: bool) -> torch.Tensor:
    """A per-tensor scale as our [] fp32 multiplier (1 / t where the format stores the divisor)."""
    if t.numel() != 1 and not bool((t == t.reshape(-1)[0]).all()):
        raise ValueError(f"{key}: expected one per-tensor scale, got {t.numel()} different values")
    g = t.reshape(-1)[0].to(torch.float32)
    if not bool(torch.isfinite(g)) or float(g) <= 0:
        raise ValueError(f"{key}: expected a positive finite scale, got {float(g)}")
    return (1.0 / g if divisor else g).reshape(())


def _nvfp4(data: torch.Tensor, scale: torch.Tensor, global_scale: torch.Tensor, keys: tuple[str, str]) -> QTensor:
    data = _packed(data, keys[0])
    n, half_k = data.shape
    if tuple(scale.shape) != (n, 2 * half_k // 16):
        raise ValueError(f"{keys[1]}: expected [{n}, {2 * half_k // 16}] block scales for {keys[0]} [{n}, {half_k}], "
                         f"got {tuple(scale.shape)}")
    if scale.dtype not in (torch.float8_e4m3fn, torch.uint8):
        raise ValueError(f"{keys[1]}: expected float8_e4m3fn block scales, got {scale.dtype}")
    return QTensor(data.contiguous(), scale.contiguous().view(torch.float8_e4m3fn), get_format("nvfp4"),
                   global_scale=global_scale.to(data.device))


def modelopt_nvfp4(tensors: Mapping, prefix: str = "") -> tuple[QTensor, torch.Tensor | None]:
    """(the weight, the activation's global scale or None) of one linear of a ModelOpt NVFP4 checkpoint."""
    g = _scalar(_get(tensors, prefix + "weight_scale_2"), prefix + "weight_scale_2", divisor=False)
    w = _nvfp4(_get(tensors, prefix + "weight"), _get(tensors, prefix + "weight_scale"), g,
               (prefix + "weight", prefix + "weight_scale"))
    key = prefix + "input_scale"
    return w, (_scalar(tensors[key], key, divisor=False) if key in tensors else None)


def compressed_tensors_nvfp4(tensors: Mapping, prefix: str = "") -> tuple[QTensor, torch.Tensor | None]:
    """(the weight, the activation's global scale or None) of one linear of a compressed-tensors
    `nvfp4-pack-quantized` checkpoint; its global scales are divisors, ours multipliers."""
    g = _scalar(_get(tensors, prefix + "weight_global_scale"), prefix + "weight_global_scale", divisor=True)
    w = _nvfp4(_get(tensors, prefix + "weight_packed"), _get(tensors, prefix + "weight_scale"), g,
               (prefix + "weight_packed", prefix + "weight_scale"))
    key = prefix + "input_global_scale"
    return w, (_scalar(tensors[key], key, divisor=True) if key in tensors else None)


def gpt_oss_mxfp4(tensors: Mapping, name: str) -> tuple[QTensor, None]:
    """(the weight, None) of gpt-oss's `<name>_blocks` [N, K / 32, 16] and `<name>_scales` [N, K / 32] (one
    expert's slice of an MoE weight: index the stored [experts, ...] tensors first)."""
    blocks_key, scales_key = f"{name}_blocks", f"{name}_scales"
    blocks, scales = _get(tensors, blocks_key), _get(tensors, scales_key)
    if blocks.dtype not in (torch.uint8, torch.int8) or blocks.dim() != 3 or blocks.shape[2] != 16:
        raise ValueError(f"{blocks_key}: expected uint8 [N, K / 32, 16], got {blocks.dtype} {tuple(blocks.shape)}")
    if scales.dtype not in (torch.uint8, torch.int8) or tuple(scales.shape) != tuple(blocks.shape[:2]):
        raise ValueError(f"{scales_key}: expected uint8 {tuple(blocks.shape[:2])} E8M0 codes, got {scales.dtype} "
                         f"{tuple(scales.shape)}")
    n, groups, _ = blocks.shape
    data = blocks.contiguous().view(torch.uint8).reshape(n, groups * 16)
    return QTensor(data, scales.contiguous().view(torch.uint8).view(torch.float8_e8m0fnu), get_format("mxfp4")), None


_READERS = {"modelopt_nvfp4": modelopt_nvfp4, "compressed_tensors_nvfp4": compressed_tensors_nvfp4,
            "gpt_oss_mxfp4": gpt_oss_mxfp4}


def load_weight(tensors: Mapping, prefix: str, checkpoint_format: str) -> tuple[QTensor, torch.Tensor | None]:
    """(the weight, the activation's global scale or None) of the linear at `prefix` (gpt-oss: the tensor name
    before `_blocks`) in `checkpoint_format` (one of `FORMATS`)."""
    if checkpoint_format not in _READERS:
        raise ValueError(f"checkpoint_format: expected one of {FORMATS}, got {checkpoint_format!r}")
    return _READERS[checkpoint_format](tensors, prefix)


def load_linear(tensors: Mapping, prefix: str, checkpoint_format: str, *, bias: torch.Tensor | None = None,
                activation_format: str | None = None, device: torch.device | str | None = None):
    """A `blockscaled.nn.QuantizedLinear` of the linear at `prefix`: its weight in the layout the fastest kernel on
    `device` reads (`QTensor.for_device`), `bias` (or the checkpoint's `<prefix>bias`), and with `activation_format`
    the checkpoint's static activation global scale when it has one (else computed in each call)."""
    from .nn import QuantizedLinear

    w, act_scale = load_weight(tensors, prefix, checkpoint_format)
    device = torch.device(device) if device is not None else w.device
    if bias is None and prefix + "bias" in tensors:
        bias = tensors[prefix + "bias"]
    bias = None if bias is None else bias.to(device)
    scale = float(act_scale) if activation_format is not None and act_scale is not None else None
    return QuantizedLinear(w.for_device(device), bias, activation_format=activation_format,
                           activation_global_scale=scale)


_WEIGHT_KEYS = {"modelopt_nvfp4": "weight_scale_2", "compressed_tensors_nvfp4": "weight_packed"}
_GLOBAL_SCALE_KEYS = {"modelopt_nvfp4": "weight_scale_2", "compressed_tensors_nvfp4": "weight_global_scale"}


def detect_format(tensors: Mapping) -> str:
    """The per-linear checkpoint format of `tensors` from its key names (ModelOpt: `*.weight_scale_2`;
    compressed-tensors: `*.weight_packed`)."""
    found = {fmt for fmt, key in _WEIGHT_KEYS.items() if any(k.endswith("." + key) for k in tensors)}
    if len(found) != 1:
        raise ValueError(f"tensors: expected the keys of one of {tuple(_WEIGHT_KEYS)} checkpoints, found "
                         f"{sorted(found) or 'none'} (gpt-oss MXFP4 experts: load_weight per expert)")
    return found.pop()


def stack_weights(weights: list[QTensor]) -> QTensor | None:
    """Weights of one K stacked along N (sibling projections as one layer), or None where that would change a value:
    another format or K, or another per-tensor global scale (published NVFP4 checkpoints give the siblings of a fused
    layer one global scale, as vLLM's fused layers require). As the readers give them: row-major scales, k_order."""
    first = weights[0]
    for w in weights:
        if w.layout != "rowmajor" or w.data_layout != "k_order" or (w.fmt, w.K) != (first.fmt, first.K):
            return None
        if first.global_scale is not None and not torch.equal(w.global_scale.cpu(), first.global_scale.cpu()):
            return None
    return QTensor(torch.cat([w.data for w in weights]), torch.cat([w.scale for w in weights]), first.fmt,
                   global_scale=first.global_scale)


def _fused_linear(tensors, parent_name, parent, names, checkpoint_format, activation_format, device, filter_fn):
    """The siblings `names` of `parent` loaded as one `QuantizedLinear` (their weights stacked, `stack_weights`), or
    None where they cannot be: not all nn.Linears in the file and passing `filter_fn`, biases on some only, other
    devices, weights that do not stack exactly, or (with `activation_format`) different static activation scales."""
    from torch import nn

    from .nn import QuantizedLinear

    modules = [getattr(parent, n, None) for n in names]
    prefixes = [f"{parent_name}.{n}." if parent_name else f"{n}." for n in names]
    if not all(type(m) is nn.Linear and p + _WEIGHT_KEYS[checkpoint_format] in tensors
               and (filter_fn is None or filter_fn(p[:-1], m)) for m, p in zip(modules, prefixes)):
        return None
    key = _GLOBAL_SCALE_KEYS[checkpoint_format]  # read before the weights: siblings of other global scales load once
    if not all(torch.equal(_get(tensors, prefixes[0] + key), _get(tensors, p + key)) for p in prefixes[1:]):
        return None
    loaded = [load_weight(tensors, p, checkpoint_format) for p in prefixes]
    for (w, _), m, p in zip(loaded, modules, prefixes):
        _check_shape(w, m, p)
    biases = [tensors.get(p + "bias", m.bias) for m, p in zip(modules, prefixes)]
    devices = {m.weight.device for m in modules}
    scales = {None if a is None else float(a) for _, a in loaded} if activation_format is not None else {None}
    stacked = stack_weights([w for w, _ in loaded])
    if stacked is None or len(scales) != 1 or len(devices) != 1 or len({b is None for b in biases}) != 1:
        return None
    device = torch.device(device) if device is not None else devices.pop()
    bias = None if biases[0] is None else torch.cat([b.detach().to(device) for b in biases])
    return QuantizedLinear(stacked.for_device(device), bias, activation_format=activation_format,
                           activation_global_scale=scales.pop()), tuple(m.out_features for m in modules)


def _check_shape(w: QTensor, module, prefix: str) -> None:
    if w.shape != (module.out_features, module.in_features):
        raise ValueError(f"tensors: {prefix} holds a [{w.shape[0]}, {w.shape[1]}] weight, the model's "
                         f"{prefix[:-1]} is [{module.out_features}, {module.in_features}]")


def load_experts(tensors: Mapping, prefix: str, module, *, device: torch.device | str | None = None):
    """A `blockscaled.nn.QuantizedExperts` of transformers' gpt-oss experts `module` from the published MXFP4 tensors
    at `prefix` (`gate_up_proj_blocks` [E, 2I, H / 32, 16], `gate_up_proj_scales` [E, 2I, H / 32], `down_proj_blocks`
    [E, H, I / 32, 16], `down_proj_scales`, the biases `gate_up_proj_bias` [E, 2I] / `down_proj_bias` [E, H] where
    the file has them, else the module's): each expert's codes as stored (rows are output features, as transformers'
    dequantizer reads them before it transposes), in the layout `device`'s kernels read."""
    from .nn import QuantizedExperts, QuantizedLinear

    why = QuantizedExperts.supported(module, get_format("mxfp4").block_size)
    if why or not getattr(module, "is_transposed", False):
        raise ValueError(f"module: expected transformers' gpt-oss experts layout, got {type(module).__name__} ({why})")
    device = torch.device(device) if device is not None else module.gate_up_proj.device

    def layers(name, param):
        blocks, scales = _get(tensors, f"{prefix}{name}_blocks"), _get(tensors, f"{prefix}{name}_scales")
        biases = tensors.get(f"{prefix}{name}_bias", getattr(module, f"{name}_bias"))
        want = tuple(param.shape[i] for i in (0, 2, 1))  # [E, out features, in features]
        if blocks.dim() != 4 or (blocks.shape[0], blocks.shape[1], blocks.shape[2] * 32) != want:
            raise ValueError(f"tensors: {prefix}{name}_blocks is {tuple(blocks.shape)}, the model's experts need "
                             f"[{want[0]}, {want[1]}, {want[2] // 32}, 16]")
        out = []
        for e in range(blocks.shape[0]):
            w, _ = gpt_oss_mxfp4({"w_blocks": blocks[e], "w_scales": scales[e]}, "w")
            out.append(QuantizedLinear(w.for_device(device), biases[e].detach().to(device)))
        return out

    return QuantizedExperts(layers("gate_up_proj", module.gate_up_proj), layers("down_proj", module.down_proj),
                            QuantizedExperts.gating_of(module))


def load_model_(model, tensors: Mapping, checkpoint_format: str | None = None, *,
                activation_format: str | None = None, device: torch.device | str | None = None,
                filter_fn=None, fuse_projections: bool = True) -> dict[str, str]:
    """Replace, in place, every `nn.Linear` of `model` whose quantized weight `tensors` holds (its module name + ".")
    by a `QuantizedLinear` loaded from them (`load_linear`; the checkpoint's bias, else the module's);
    returns {name: "loaded" or why it was kept}. `checkpoint_format` None: `detect_format`. With
    `activation_format` the checkpoint's static activation scales are used (W4A4), else activations stay bf16.
    `fuse_projections` (as `blockscaled.nn.quantize_model_`'s): sibling projections of one input (q / k / v,
    gate / up) whose weights stack exactly (`stack_weights`: one global scale) become one layer, reported
    "loaded, fused into NAME"; siblings that do not stay apart. gpt-oss's MXFP4 experts (transformers' experts modules
    whose `<name>.gate_up_proj_blocks` the file holds) load as a `QuantizedExperts` each (`load_experts`), reported
    "loaded experts"; `checkpoint_format` "gpt_oss_mxfp4" (or a file of such experts and no quantized linears) loads
    only those."""
    from torch import nn

    from .nn import FUSED_PROJECTIONS, QuantizedLinear, install_fused, replace_module

    report = {}
    for name, module in list(model.named_modules()):
        if f"{name}.gate_up_proj_blocks" not in tensors or not isinstance(getattr(module, "gate_up_proj", None),
                                                                          nn.Parameter):
            continue
        if filter_fn is not None and not filter_fn(name, module):
            report[name] = "kept: filter_fn"
            continue
        replace_module(model, name, load_experts(tensors, name + ".", module, device=device))
        report[name] = "loaded experts"
    if checkpoint_format == "gpt_oss_mxfp4" or (checkpoint_format is None and report and not any(
            k.endswith("." + key) for key in _WEIGHT_KEYS.values() for k in tensors)):
        return report
    checkpoint_format = checkpoint_format or detect_format(tensors)
    if checkpoint_format not in _WEIGHT_KEYS:
        raise ValueError(f"checkpoint_format: load_model_ reads {tuple(_WEIGHT_KEYS)} and 'gpt_oss_mxfp4' experts, "
                         f"got {checkpoint_format!r}")
    if fuse_projections:
        for parent_name, parent in list(model.named_modules()):
            for names, fused_name in FUSED_PROJECTIONS:
                if hasattr(parent, fused_name):
                    continue
                fused = _fused_linear(tensors, parent_name, parent, names, checkpoint_format, activation_format,
                                      device, filter_fn)
                if fused is not None:
                    install_fused(parent, f"{parent_name}." if parent_name else "", names, fused_name, *fused,
                                  report, "loaded")
    for name, module in list(model.named_modules()):
        if not isinstance(module, nn.Linear) or isinstance(module, QuantizedLinear):
            continue
        prefix = name + "."
        if prefix + _WEIGHT_KEYS[checkpoint_format] not in tensors:
            report[name] = "kept: no quantized weight in tensors"
            continue
        if filter_fn is not None and not filter_fn(name, module):
            report[name] = "kept: filter_fn"
            continue
        layer = load_linear(tensors, prefix, checkpoint_format, bias=tensors.get(prefix + "bias", module.bias),
                            activation_format=activation_format,
                            device=device if device is not None else module.weight.device)
        _check_shape(layer.weight, module, prefix)
        replace_module(model, name, layer)
        report[name] = "loaded"
    return report
