"""`python -m bench.model`: a transformers model with every linear swapped by `quantize_model_`, against bf16.

The model is built from a config with random weights (nothing is downloaded): "llama3-8b" has Llama-3-8B's
dimensions, "qwen2.5-7b" Qwen2.5-7B's (biased q / k / v projections; `--layers` cuts the depth to save time: every
layer is alike), "mixtral-8x7b" Mixtral's (8 experts, 2 a token: `blockscaled.nn.QuantizedExperts`, captured as
every expert on every token; bf16 runs transformers' default experts implementation; the `decode_mode` column says
whether each variant's step was captured), "gpt-oss-20b" gpt-oss-20b's (32 experts, 4 a token, biased and
transposed), "tiny", "tiny-qwen2", "tiny-mixtral" and "tiny-gpt-oss" are CI's. Per variant (bf16, then
each `--formats` entry as WEIGHT, WEIGHT:ACTIVATION, or WEIGHT:nvfp4:static, whose activation scales are calibrated
on another random prompt first, `blockscaled.nn.calibrate`):
- prefill: one forward of [batch, prefill] tokens (the last position's logits), ms (median of `--reps`);
- decode: greedy steps with a static KV cache, one step per CUDA-graph replay where capture works (else eager,
  said in the `decode_mode` column), tokens/s over the batch;
- agreement with the bf16 model on the prefill's last 256 positions: next-token agreement (argmax at each) and logits
  SQNR (dB): what the format costs, of the eager forward (from 2026-12-01; rows before compared the compiled one, so
  their bf16 row's agreement was inductor's against eager, e.g. 0.81-0.85 and 23 dB, where it is now 1 and inf);
- `kernel_sqnr_db`: the kernels' check: every quantized linear's output, on the input it saw in the prefill and in
  one decode step (M = batch), against torch's fp32 product of the same codes (weights dequantized, the activation
  quantized by the same function and dequantized; TF32 off); the worst layer's SQNR (dB). Logit agreement of a
  random-weight model falls with depth at any format (its layers amplify differences), so it is no kernel check.
`--compile inductor` compiles every variant's forward alike (the decode step is still captured in one CUDA graph;
two whole-model compiles a variant, the timed prefill and the decode step, a few minutes at 8B on a fresh machine):
eager Hugging Face layers spend most of a decode step outside the linears. The lm_head stays bf16 (as serving
engines leave it) unless the variant has "+lm_head"; q / k / v and gate / up run as one layer each, as serving
engines do (`quantize_model_`'s default from 2026-11-30; "+separate": each its own layer, as rows before it without
"+fused"). Rows go to bench/results/<gpu>_model.csv (`--no-record`:
not).
"""

from __future__ import annotations

import argparse
import copy
import csv
import datetime
import math
import time
from pathlib import Path

import torch

# name: (transformers family, config); Qwen2's q / k / v projections carry a bias
CONFIGS = {
    "tiny": ("llama", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)),
    "tiny-qwen2": ("qwen2", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=256, max_position_embeddings=512)),
    "tiny-mixtral": ("mixtral", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, vocab_size=256, max_position_embeddings=512,
                                     num_local_experts=4, num_experts_per_tok=2)),
    "tiny-gpt-oss": ("gpt_oss", dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=4096,
                                     num_local_experts=4, num_experts_per_tok=2, sliding_window=16)),
    "llama3-8b": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                                num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192,
                                rope_theta=500000.0)),
    "qwen2.5-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                                 num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                                 rope_theta=1000000.0)),
    "mixtral-8x7b": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, vocab_size=32000,
                                     max_position_embeddings=32768, rope_theta=1000000.0, num_local_experts=8,
                                     num_experts_per_tok=2)),
    "gpt-oss-20b": ("gpt_oss", dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                                    num_attention_heads=64, num_key_value_heads=8, head_dim=64, vocab_size=201088,
                                    max_position_embeddings=131072, num_local_experts=32, num_experts_per_tok=4,
                                    sliding_window=128)),
}
# positions per sequence whose logits are compared (all 2048 of batch 16 over Llama-3's vocabulary would be 17 GB)
AGREEMENT_POSITIONS = 256
FIELDS = ["date", "commit", "gpu", "model", "layers", "variant", "compile", "batch", "prefill", "prefill_ms", "decode_mode",
          "decode_tokens_per_s", "token_agreement", "logits_sqnr_db", "kernel_sqnr_db", "attention"]
# the attention of rows recorded before the column existed: transformers' own
ATTENTION_BEFORE_THE_COLUMN = "sdpa"


def build(name: str, layers: int | None, device, seed: int = 0, attention: str = "sdpa"):
    """(config, bf16 model) of `name` with random weights on `device`; with attention "packed_gqa" the decode steps'
    grouped-query attention packed onto the key / value heads (`blockscaled.attention`; every variant copies it)."""
    import transformers

    family, cfg = CONFIGS[name]
    cfg = dict(cfg)
    if layers:
        cfg["num_hidden_layers"] = layers
    torch.manual_seed(seed)
    prefix = {"llama": "Llama", "qwen2": "Qwen2", "mixtral": "Mixtral", "gpt_oss": "GptOss"}[family]
    config = getattr(transformers, f"{prefix}Config")(**cfg)
    with torch.device(device):  # initialized where it runs (8B parameters initialize in minutes on the host)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config).to(dtype=torch.bfloat16).eval()
    if attention == "packed_gqa" and model.config._attn_implementation == "sdpa":  # (gpt-oss runs its own)
        from blockscaled.attention import use_packed_gqa

        use_packed_gqa(model)
    return model.config, model


def quantized(model, variant: str, calibration=None):
    """A copy of `model` with its linears swapped for `variant` = WEIGHT[:ACTIVATION[:static]][+lm_head][+separate]:
    q / k / v and gate / up each one layer (`quantize_model_`'s `fuse_projections`), or with "+separate" each its
    own ("+fused", the default, is accepted as older records name it); with
    ":static", nvfp4 activation scales calibrated (`blockscaled.nn.calibrate`) on one forward of `calibration`; with
    "+lm_head", the lm_head quantized too (else it stays bf16, as serving engines leave it: Llama-3-8B's is 1.05 GB
    of its 16 GB of bf16 weights)."""
    from blockscaled.nn import calibrate, quantize_model_

    base_variant, *extras = variant.split("+")
    weight_format, _, activation_format = base_variant.partition(":")
    activation_format, _, mode = activation_format.partition(":")
    if mode not in ("", "static") or (mode and activation_format != "nvfp4") or not set(extras) <= {"lm_head", "fused", "separate"}:
        raise ValueError(f"--formats: {variant!r}: expected WEIGHT, WEIGHT:ACTIVATION or WEIGHT:nvfp4:static, each "
                         f"optionally with +lm_head and +separate")
    def wanted(name):
        return "lm_head" in extras or not name.endswith("lm_head")

    q = copy.deepcopy(model)
    report = quantize_model_(q, weight_format, activation_format=activation_format or None,
                             filter_fn=lambda name, _: wanted(name), fuse_projections="separate" not in extras)
    skipped = {k: v for k, v in report.items() if not v.startswith("quantized") and wanted(k)}
    if skipped:
        raise RuntimeError(f"{variant}: layers not quantized: {skipped}")
    if mode:
        with calibrate(q), torch.no_grad():
            q(calibration, use_cache=False, logits_to_keep=1)
    return q


class FakeQuantLinear(torch.nn.Module):
    """A QuantizedLinear's codes multiplied by torch in fp32: the kernels' reference inside a model."""

    def __init__(self, q):
        super().__init__()
        self.activation_format, self.scale_rounding = q.activation_format, q.scale_rounding
        self.activation_global_scale = q.activation_global_scale
        self.weight = q.weight.dequantize(torch.float32)
        self.bias = q.bias

    def forward(self, x):
        import blockscaled as bs

        x2 = x.reshape(-1, x.shape[-1]).to(torch.bfloat16).contiguous()
        if self.activation_format is not None:
            x2 = bs.quantize(x2, self.activation_format, scale_rounding=self.scale_rounding,
                             global_scale=self.activation_global_scale).dequantize(torch.float32)
        y = x2.float() @ self.weight.T
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*x.shape[:-1], -1)


def kernel_sqnr(model, fn) -> float:
    """The worst SQNR (dB) over `model`'s QuantizedLinears of their output in `fn()` against `FakeQuantLinear` of
    the same codes on the same input."""
    from blockscaled.nn import QuantizedLinear

    worst = [math.inf]

    def check(module, inputs, output):
        want = FakeQuantLinear(module)(inputs[0]).double()
        d = output.double() - want
        noise = float((d * d).sum())
        if noise:
            worst[0] = min(worst[0], 10 * math.log10(float((want * want).sum()) / noise))

    hooks = [m.register_forward_hook(check) for m in model.modules() if isinstance(m, QuantizedLinear)]
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        with torch.no_grad():
            fn()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        for h in hooks:
            h.remove()
    return worst[0]


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time_ms(fn, device, reps: int) -> float:
    """Median ms of `reps` calls of `fn` after one untimed call (an inductor model compiles there: with --reps 2 the
    median had been the compiling call, 22 s for a 2048-token prefill of 54 ms)."""
    fn()
    times = []
    for _ in range(reps):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t) * 1e3)
    return sorted(times)[len(times) // 2]


def write_profile(fn, device, path: Path, rows: int = 60) -> None:
    """`fn()` under torch.profiler (warm: after the timed runs), its kernels by total device time (the top `rows`)
    written to `path`."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            _sync(device)
    table = prof.key_averages().table(sort_by="self_device_time_total", row_limit=rows, max_name_column_width=90)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(table)


def decode(model, config, prompt: torch.Tensor, steps: int, graphs: bool,
           profile: Path | None = None, prefill_model=None) -> tuple[torch.Tensor, float, str]:
    """Greedy `steps` tokens after `prompt` with a static cache: (tokens [batch, steps], tokens/s, mode); with
    `profile`, 8 more steps under torch.profiler after the timed ones, their kernels by device time written there.
    `prefill_model` (else `model`) fills the cache: untimed, so the eager model where `model` is compiled (a
    compiled forward over the prompt with a cache is one more whole-model compile, minutes at 8B)."""
    from transformers import StaticCache

    device = prompt.device
    batch, length = prompt.shape
    # transformers 5 places each step at its own count of steps taken (warm-ups included), not at `cache_position`
    cache = StaticCache(config=config, max_cache_len=length + steps + 4 + (8 if profile is not None else 0))
    with torch.no_grad():
        logits = (prefill_model or model)(input_ids=prompt, past_key_values=cache,
                                          cache_position=torch.arange(length, device=device), use_cache=True).logits
    token = logits[:, -1:].argmax(-1)
    ids = token.clone()
    pos = torch.tensor([length], device=device)

    def step():
        return model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True).logits

    mode, run = "eager", step
    if graphs and device.type == "cuda":
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.no_grad():
                for _ in range(2):  # warm-up writes the cache at `pos`; every replay rewrites it there first
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                static_logits = step()
            mode, run = "cudagraph", lambda: (graph.replay(), static_logits)[1]
        except Exception as e:  # noqa: BLE001 - recorded as the mode; eager still measures
            mode = f"eager (capture failed: {type(e).__name__})"
    out = []
    _sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        for t in range(steps):
            ids.copy_(token)
            pos.fill_(length + t)
            token = run()[:, -1:].argmax(-1)
            out.append(token)
    _sync(device)
    seconds = time.perf_counter() - start
    if profile is not None:
        def steps8():
            for t in range(8):
                pos.fill_(length + steps + t)
                run()

        write_profile(steps8, device, profile)
    return torch.cat(out, dim=1), batch * steps / seconds, mode


def agreement(ref_logits: torch.Tensor, logits: torch.Tensor) -> tuple[float, float]:
    """(next-token agreement, logits SQNR in dB) of `logits` against `ref_logits` [batch, length, vocab]."""
    same = (ref_logits.argmax(-1) == logits.argmax(-1)).float().mean().item()
    r, d = ref_logits.double(), (ref_logits.double() - logits.double())
    noise = float((d * d).sum())
    return same, (math.inf if noise == 0 else 10 * math.log10(float((r * r).sum()) / noise))


def run(args, on_row=lambda row: None) -> list[dict]:
    """Every (batch, variant) row; `on_row(row)` as each is made (a run cut by a time limit keeps what it finished).
    `--compile inductor+pdl`: inductor with its programmatic dependent launch (`triton.enable_pdl`: each generated
    kernel launched with PDL, waiting before its first read of the kernel before's output)."""
    if args.compile != "inductor+pdl":
        return _run(args, on_row)
    import torch._inductor.config as inductor_config

    with inductor_config.patch({"triton.enable_pdl": True}):
        return _run(args, on_row)


def decode_attention_refuses(config, device) -> str | None:
    """Why `kernels.decode_attention` refuses a decode step of `config`'s heads on `device` (None: it runs it)."""
    from blockscaled.kernels.decode_attention import supported

    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    q = torch.empty(1, kv, heads // kv, dim, dtype=torch.bfloat16, device=device)
    k = torch.empty(1, kv, 2, dim, dtype=torch.bfloat16, device=device)
    return supported(q, k, k, None)


def _run(args, on_row) -> list[dict]:
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    config, base = build(args.model, args.layers, device, attention=args.attention)
    gen = torch.Generator(device="cpu").manual_seed(1)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    from .__main__ import git_commit

    from blockscaled.attention import NAME as PACKED_GQA

    # the attention the model runs (a family not on sdpa keeps its own under --attention packed_gqa); "->sdpa" where
    # the decode kernel refuses the model's heads and the packed attention falls back to SDPA (as Qwen2.5-7B's 7 query
    # heads a key / value head did before d14e78b)
    attention = "packed_gqa" if config._attn_implementation == PACKED_GQA else config._attn_implementation
    if attention == "packed_gqa" and decode_attention_refuses(config, device):
        attention = "packed_gqa->sdpa"
    stamp = dict(date=datetime.date.today().isoformat(), commit=git_commit(), gpu=gpu, model=args.model,
                 layers=config.num_hidden_layers, attention=attention)
    rows = []
    for batch in args.batch:
        prompt = torch.randint(0, config.vocab_size, (batch, args.prefill), generator=gen).to(device)
        keep = min(args.prefill, AGREEMENT_POSITIONS)
        with torch.no_grad():
            ref_logits = base(prompt, use_cache=False, logits_to_keep=keep).logits.float()
        # the static-scale variants' calibration data: another random prompt of the same shape
        calibration = torch.randint(0, config.vocab_size, (batch, args.prefill), generator=gen).to(device)
        for variant in ["bf16", *args.formats]:
            model = base if variant == "bf16" else quantized(base, variant, calibration)
            name = f"{variant.replace(':', '_').replace('+', '_')}_{args.compile.replace('+', '_')}_b{batch}"
            # every variant, bf16 too, compiled alike (static shapes: prefill and decode compile once each); the reset
            # keeps the variants' graphs from filling Dynamo's recompile limit on the shared forward code (8: the
            # fourth variant ran eagerly without it)
            if args.compile != "none":
                torch._dynamo.reset()
            fwd = (torch.compile(model, backend=args.compile.split("+")[0], dynamic=False) if args.compile != "none"
                   else model)
            with torch.no_grad():
                # agreement of the model's own forward (eager: a compiled forward keeping `keep` positions is one
                # more whole-model compile, and the compiled graph calls the same custom ops)
                logits = model(prompt, use_cache=False, logits_to_keep=keep).logits.float()
                # a serving prefill: the last position's logits only
                prefill_ms = _time_ms(lambda: fwd(prompt, use_cache=False, logits_to_keep=1), device, args.reps)
            same, sqnr = agreement(ref_logits, logits)
            if args.profile:
                write_profile(lambda: fwd(prompt, use_cache=False, logits_to_keep=1), device,
                              args.profile / f"prefill_{name}.txt")
            kernel_db = math.inf
            if model is not base:
                kernel_db = min(kernel_sqnr(model, lambda: model(prompt, use_cache=False, logits_to_keep=1)),
                                kernel_sqnr(model, lambda: model(prompt[:, -1:], use_cache=False)))
            _, tps, mode = decode(fwd, config, prompt, args.decode, not args.no_graphs,
                                  args.profile / f"decode8_{name}.txt" if args.profile else None, prefill_model=model)
            row = dict(stamp, variant=variant, compile=args.compile, batch=batch, prefill=args.prefill,
                       prefill_ms=f"{prefill_ms:.3f}",
                       decode_mode=mode, decode_tokens_per_s=f"{tps:.1f}", token_agreement=f"{same:.4f}",
                       logits_sqnr_db=f"{sqnr:.2f}", kernel_sqnr_db=f"{kernel_db:.2f}")
            print(" ".join(f"{k}={row[k]}" for k in ("variant", "batch", "prefill_ms", "decode_mode",
                                                     "decode_tokens_per_s", "token_agreement", "logits_sqnr_db", "kernel_sqnr_db")))
            rows.append(row)
            on_row(row)
            if model is not base:
                del model, fwd
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def record(rows: list[dict], folder: Path) -> Path:
    from .__main__ import result_name

    path = folder / f"{result_name(rows[0]['gpu'])}_model.csv"
    new = not path.exists()
    if not new:  # a file of older columns: rewritten with every column, the new ones filled as they were then
        with path.open(newline="") as f:
            old = list(csv.DictReader(f))
        if old and list(old[0]) != FIELDS:
            with path.open("w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
                w.writeheader()
                w.writerows({"attention": ATTENTION_BEFORE_THE_COLUMN, **r} for r in old)
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        if new:
            w.writeheader()
        w.writerows(rows)
    return path


def parse_args(argv=None) -> argparse.Namespace:
    from .__main__ import RESULTS

    p = argparse.ArgumentParser(prog="python -m bench.model", description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=list(CONFIGS), default="llama3-8b")
    p.add_argument("--layers", type=int, help="keep this many decoder layers (default: the model's)")
    p.add_argument("--formats", nargs="+", default=["nvfp4", "mxfp4", "mxfp8", "nvfp4:nvfp4"],
                   help="WEIGHT, WEIGHT:ACTIVATION or WEIGHT:nvfp4:static (calibrated activation scales) formats, each "
                        "optionally with +lm_head (the lm_head quantized too) and +separate (q / k / v, gate / up not fused)")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    p.add_argument("--prefill", type=int, default=2048)
    p.add_argument("--decode", type=int, default=64, help="greedy steps timed")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device")
    p.add_argument("--no-graphs", action="store_true", help="decode eagerly")
    p.add_argument("--compile", default="none",
                   help="torch.compile backend for every variant's forward (inductor: the norms, rotary and "
                        "attention glue fused, each QuantizedLinear one custom op; inductor+pdl: its kernels "
                        "launched with programmatic dependent launch, sm_90+); none: eager")
    # packed_gqa by default: Llama-3-8B compiled on an H200, bf16 158.8 -> 183.6 tokens/s, nvfp4 292.1 -> 371.5
    p.add_argument("--attention", choices=["packed_gqa", "sdpa"], default="packed_gqa",
                   help="every variant's attention (bf16's too): packed_gqa (`blockscaled.attention`: decode steps' "
                        "grouped-query attention split along the keys, no copies of the cache per query head), or "
                        "transformers' sdpa")
    p.add_argument("--profile", type=Path, help="write each variant's prefill and 8 decode steps' kernels by device time to this folder")
    p.add_argument("--no-record", action="store_true")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    if "+" in args.compile and args.compile != "inductor+pdl":
        p.error(f"--compile {args.compile}: a torch.compile backend, or inductor+pdl")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)

    def on_row(row):
        if not args.no_record and row["gpu"] != "cpu":
            print(f"appended a row to {record([row], args.results)}")

    run(args, on_row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
