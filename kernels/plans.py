"""The mma kernels' plans: what a call of `mma_gemv_kernel` (M <= 16) or `mma_m64_kernel` (M > 16) runs, as data.

| object          | what it holds                                                                             |
|-----------------|-------------------------------------------------------------------------------------------|
| `MmaOptions`    | the plan's knobs, one named field each: a config's keys (`_mma_options` checks them) or   |
|                 | the defaults below; `kernels/tuned/<gpu>.json` holds tuned ones per (pair, M, shape)      |
| `MmaPlan`       | what one cache key launches: the Helion config, the kernel's named constexprs, split-K,   |
|                 | the scratch a call needs (`scratch.ScratchSpec`), the activation's predecode              |
| `MMA_*`         | each default under its own comment: the rule and the one measurement that decided it      |
|                 | (the longer reasons: docs/PLANS.md, one section per constant)                             |

How a plan is made (`mma_options_for`, then `_mma_plan`):
1. options: a given config laid over the defaults, else the GPU's tuned entry (`api._tuned_options`), else the
   defaults of (M, activation kind, weight kind, alignment) (`_default_mma_options`);
2. the K work: warps or K slices inside a program (`_mma_k_warps`, `_mma_k_slices`) or split-K by the wave rule
   (`_mma_split`: the smallest power of two whose last wave of programs is at least 90% full);
3. how the parts sum (clusters, `_mma_cluster`), PDL (`_mma_pdl_by_plan`), unroll, eviction hints;
4. the kernel's constexprs by name (`mma_constants`) and the scratch spec.
The dispatcher (`api.scaled_mm`) reads the plan; nothing here launches.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

import helion
import helion.language as hl

from blockscaled.qtensor import QTensor

from .decode import (CLUSTER_MAX_CTAS, MMA_CLUSTER_SUM_PTX, MMA_M64_B_ROWS, MMA_STAGED_B_MAX_BYTES, MMA_STAGED_B_STORE_PTX,
                     STATIC_SHARED_BYTES, cluster_sum_bytes, m64_exchange_buffer, operand_codes, staged_b_bytes,
                     staged_b_chunks)
from .scratch import ScratchSpec


# ---- the device --------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability, looked up once: `scaled_mm` asks on every call."""
    return torch.cuda.get_device_capability(device)


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4


def _ptx_decodes(device: torch.device) -> bool:
    """Whether kernels decode with inline PTX there (NVIDIA GPUs; not the CPU interpreter, not AMD)."""
    return device.type == "cuda" and torch.version.hip is None


def _has_pdl(device: torch.device) -> bool:
    """Whether the device runs programmatic dependent launch (`griddepcontrol`: sm_90 and later)."""
    return _ptx_decodes(device) and _capability(device) >= (9, 0)


def _has_wgmma(device: torch.device) -> bool:
    """Whether the device runs wgmma (sm_90, Hopper; Blackwell has tcgen05 instead)."""
    return _ptx_decodes(device) and _capability(device) == (9, 0)



# ---- defaults ----------------------------------------------------------------------------------------------------

# The mma kernels (mma_gemv.py) run every pair on "mma_m16k16" weights: mma_gemv_kernel up to MMA_WARP_M rows,
# mma_m64_kernel above (M = 128: 0.80x against 0.18x for the k_order kernels, nvfp4 x nvfp4, H100).
MMA_PAIRS = ("bf16xmxfp4", "bf16xnvfp4", "mxfp4xmxfp4", "nvfp4xnvfp4", "mxfp8xmxfp4", "bf16xmxfp8", "mxfp8xmxfp8")
MMA_WARP_M = 16
# Split-K cap by (column groups, row groups): 32 at M = 1 was fastest at three of the four Llama-3-70B shapes (H100).
MMA_MAX_SPLIT = {(1, 1): 32, (1, 2): 64, (2, 1): 8, (2, 2): 16}
# Resident programs per SM of the wave rule (from the sm_90 register counts): a short last wave cost 14% at
# 10240 x 8192, M = 1 (split 16: 1.21 waves, 2.57x against 2.98x at split 32).
MMA_PROGRAMS_PER_SM = {(False, 1, 1): 16, (True, 1, 1): 12, (False, 2, 2): 8, (True, 2, 2): 8}
# Row groups per warp by (narrow activation, column groups): two share one B decode (nvfp4 x nvfp4, M = 1, 57344 x
# 8192: 2.81x -> 3.18x).
MMA_ROW_GROUPS = {(False, 1): 1, (True, 1): 2, (False, 2): 2, (True, 2): 2}
# B decoded once per program and shared through shared memory, by (narrow activation, column groups): M = 16
# faster or equal in all 20 cells (mxfp4 x mxfp4, 8192 x 28672: 2.24x -> 3.02x).
MMA_SHARED_B = {(False, 1): False, (True, 1): True, (False, 2): True, (True, 2): True}
# mma_m64_kernel: split-K cap and resident programs (wgmma 3 per SM, mma.sync 2) by (wgmma, fp4 / fp8 activations
# on fp4 weights); cap 8 against 16 at 10240 x 8192, M = 64: 0.99-1.15x against 0.87-0.92x.
MMA_M64_MAX_SPLIT = 8
MMA_M64_PROGRAMS_PER_SM = {(True, False): 3, (True, True): 2, (False, False): 2, (False, True): 2}
# 128 activation rows per program take 127 registers: 2 per SM (bf16 x mxfp4, M = 128, 10240 x 8192: 0.62x -> 0.71x).
MMA_M64_TILE_128_PROGRAMS_PER_SM = 2
# Above MMA_TILE_128_MAX_M no split-K once programs fill half a wave: its workspace adds grow with M (M = 192,
# 10240 x 8192, bf16 x mxfp4: 0.65x split, 0.84x unsplit).
MMA_M64_UNSPLIT_WAVES = 0.5
# Split-K sums in the workspace in fragment order, one red.global.add.v4.f32 per 4 sums: the epilogue 13.2 -> 8.2 us
# (M = 64, N = 8192, split 4).
MMA_M64_FRAGMENT_SUMS = True
# bf16 / fp8 activations in 16-byte loads where 16-byte aligned: bf16 x mxfp4, M = 64, 8192 x 28672: 83.0 -> 76.4 us.
MMA_M64_WIDE_B = True
# The wave rule may take a split that does not divide K where a power of two leaves a wave under 90% full:
# 6 instead of 4 at 8192^2, M = 64 (bf16 x nvfp4 31.8 -> 30.0 us).
MMA_M64_UNEVEN_SPLIT = True
# Windows loaded ahead of the one multiplied: mma_m64_kernel 1 (2-3 no faster), mma_gemv_kernel 0 (1 only with shared B).
MMA_M64_AHEAD = 1
MMA_AHEAD = 0
# fp8 weights at 8 < M <= 16 split up to 8, no wave rule (mxfp8 x mxfp8, 8192^2: 1.53x against 1.43x).
MMA_FP8_M16_MAX_SPLIT = 8
# fp8 weights at 8 < M <= 16 on split-K load one window ahead from this K (8192 x 28672: mxfp8 x mxfp8 1.73x ->
# 1.81x; 10240 x 8192 lost 3%). The wave rule takes powers of two only: uneven splits lost up to 14%.
MMA_FP8_M16_AHEAD_K = 16384
# bf16 activations at M = 1: K split over 16 or 8 warps of a program, summed in shared memory (no split-K epilogue,
# which cost 0.7-3.6 us of 15-19 us at 8192^2): bf16 x mxfp4 57344 x 8192 3.24x -> 3.64x.
MMA_K_WARPS = (16, 8)
# Up to K = 4096, 16 warps from 0.45 of a wave (4096^2, M = 1, bf16 x nvfp4: 6.3 -> 4.5 us).
MMA_K_WARPS_SHORT_WINDOWS = 64
MMA_K_WARPS_SHORT_MIN_WAVES = 0.45
# K windows that neither divides (Qwen2.5's K = 3584, 18944, 29568) where no dividing one passed the wave rule: the
# first K / 64 mod k_warps warps take one window more (`mma_gemv.tail_window`; no shared or staged B), from 0.4 of a
# wave, instead of one warp and split-K over the windows' few divisors (H200, M = 1, bf16 x nvfp4, tuned: 8192 x 29568
# 132.5 -> 42.7 us, 3584 x 18944 25.5 -> 18.9, 3584^2 6.5 -> 5.1; nvfp4 x nvfp4 8192 x 29568 162.5 -> 66.1).
MMA_K_WARPS_UNEVEN_MIN_WAVES = 0.4
# Split-K over parts that differ by a window where no split of 8 divides the windows (Qwen2.5-72B's 462: 2 at most
# otherwise; H200, M = 16, 8192 x 29568, split 2: 167 us, 0.71x cuBLAS bf16). Where 8 divides them, uneven splits lost
# up to 14% (fp8 weights, M = 16).
MMA_SPLIT_UNEVEN_BELOW = 8
# 1 < M <= 16: K slices of 4 warps with shared B instead of split-K, where their programs fill the GPU
# (slices, row groups, resident, waves low, high, ahead and unroll for fp4 weights; bf16 x mxfp4, M = 16, 8192^2:
# 2.07x -> 2.52x; with ahead 1 and unroll 2, 2.84x).
MMA_K_SLICES = ((4, 2, 2, 1.0, float("inf"), 0, 1), (8, 1, 1, 0.9, 1.0, 1, 2))
# bf16 x fp8 at 8 < M <= 16 where 8 slices would run: 4 slices, ahead 1, unroll 2 (8192^2: 27.6 -> 26.4 us).
MMA_BF16_FP8_M16_SLICES = (4, 1, 2)
MMA_K_SLICES_MAX_WINDOWS = 128
# Windows per K-loop iteration (Helion's range_unroll_factors on the K loop) outside `MMA_K_SLICES`.
MMA_UNROLL = 1
# PRELOAD: the most 32-bit registers the loaded words of a warp's windows may take (`_mma_preload_registers`; ptxas
# adds ~30 for addresses and sums): bf16 x fp4 at M = 1, 13 a window, preloads up to 9 windows
MMA_PRELOAD_MAX_REGISTERS = 128
# mma_m64_kernel runs two windows per iteration for fp4 weights from this K (bf16 x nvfp4, M = 64, 8192 x 28672:
# 1.51x -> 1.89x; fp8 weights lost up to 22%).
MMA_M64_UNROLL_K = 16384
# 128 activation rows per program (one weight decode for two wgmma) up to this M (M = 128, bf16 x mxfp8: 0.68x ->
# 0.87x; M = 256 lost: 0.57x -> 0.45x for nvfp4 x nvfp4).
MMA_TILE_128_MAX_M = 128
# mma_m64_kernel's warps (16 weight rows each): 16 (256 weight rows x 128 activation rows a program, tile_m 128)
# halves the activation's re-reads from L2 (docs/MID_M.md), from MMA_M64_WARPS_16_MIN_M rows where N % 256 == 0
# (H200, 8192^2, M = 512: bf16 x mxfp4 0.59x -> 0.83x, nvfp4 x nvfp4 0.56x -> 0.81x; M = 256 split: 0.68 -> 0.71x,
# 0.66 -> 0.62x), else 8. With 16, 127 registers x 512 threads: one program resident per SM for the wave rule.
MMA_M64_WARPS = 8
MMA_M64_WARPS_16_MIN_M = 512
MMA_M64_WARPS_16_PROGRAMS_PER_SM = 1


def _m64_sixteen_warps_programs(m: int, n: int) -> int:
    """mma_m64_kernel's programs (N / 256 x M / 128) where its 16-warp default applies by shape (from
    MMA_M64_WARPS_16_MIN_M rows, N % 256 == 0), else 0. Where it runs also takes wgmma and the config: `_mma_options`."""
    weight_rows = 16 * 16
    if m < MMA_M64_WARPS_16_MIN_M or n % weight_rows:
        return 0
    return n // weight_rows * -(-m // (2 * MMA_M64_B_ROWS))


# Static shared memory for mma_m64_kernel's cluster sums and B windows: 48 KB less room for Triton's own.
MMA_CLUSTER_SHARED_BYTES = STATIC_SHARED_BYTES - 4096
# Split-K parts sum in thread-block clusters only above this many programs per SM (a cluster's CTAs share one GPC):
# M = 64, 57344 x 8192, nvfp4 x nvfp4 1.56x -> 1.80x; at 256 programs clusters lost (1.33x -> 1.24x).
MMA_CLUSTER_PROGRAMS_PER_SM = 2
# mma_gemv_kernel sums its split-K parts in clusters too (M = 16, 10240 x 8192, bf16 x mxfp4: 2.59x -> 2.86x).
MMA_GEMV_CLUSTER = True
# L2 eviction hints up to M = 16: weights evict_first, activation evict_last (M = 64, nvfp4 x nvfp4: 34.7 -> 33.7 us;
# off above M = 16, where ptxas moved three pairs' loads behind the exchange fence).
MMA_EVICT = True
# Programmatic dependent launch at M <= MMA_WARP_M (launch.DirectLaunch): the kernels touch no memory before
# griddepcontrol.wait; above it off (mma_m64_kernel, M = 64, 8192^2: 34.9 -> 41.5 us with it).
MMA_PDL = True  # at M <= MMA_WARP_M; above it off by default (mma_m64_kernel, M = 64, 8192^2: 34.9 -> 41.5 us)
# but not for E8M0-scaled fp4 / fp8 activations on fp4 weights at 1 < M <= 16 past this many windows a program
# (mxfp4 x mxfp4, 8192 x 28672: 52.9-53.8 us without, 54.6-55.6 with).
MMA_PDL_MX_ACT_MAX_WINDOWS = 16
# Windows of weights each warp asks L2 for before its grid wait, by (fp8 weights, column groups): 4 only for fp8 at
# 8 < M <= 16 (mxfp8 x mxfp8, 8192^2: 25.1 -> 24.2 us; fp4 weights lost with 3 or 4).
MMA_PDL_PREFETCH = {(False, 1): 2, (False, 2): 2, (True, 1): 2, (True, 2): 4}
# config keys that change how a plan launches or hints its loads, not the plan: a config of only these keeps the
# default plan (the staged B at M = 1 included)
LAUNCH_ONLY_KEYS = {"pdl", "pdl_prefetch", "evict", "hoist"}


# fp4 / fp8 activations on fp4 weights above M = 16 are decoded to bf16 rows first ("predecode", dequantize.py), then
# the bf16 plan runs: mma_m64_kernel decoded them again in every program (mxfp4 x mxfp4, M = 32, 10240 x 8192:
# 41.1 -> 30.6 us). Not at M <= 16 (0.2-1.2 us slower) nor on fp8 weights (0.3-3.1 us slower).
MMA_PREDECODE_MIN_M = MMA_WARP_M
# ... and at M = 1 on fp4 weights where the unstaged tail plan would run instead (`_mma_plan`): H200, 8192 x 29568, that
# plan for nvfp4 x nvfp4 66.2 us, the bf16 one 42.5 (bench/results/h200_k_warps_tail_rule_ab_bf07902_2026-11-30.log);
# the predecode launch cost 0.2-1.2 us at M <= 16 (H100). Not timed together.
MMA_PREDECODE_TAIL = True


def _mma_predecode(m: int, narrow: bool, fp8_weights: bool) -> bool:
    """The default of "predecode": fp4 / fp8 activations on fp4 weights above MMA_PREDECODE_MIN_M rows."""
    return narrow and not fp8_weights and m > MMA_PREDECODE_MIN_M


def _mma_hoist(m: int, narrow: bool, fp8_weights: bool) -> bool:
    """Where the hinted loads run as inline PTX with their cache policies made once (`mma_gemv.hinted_loads`): Triton
    writes a load's policy anew for each load, 11 sm_90 instructions per K-loop iteration at M = 16 (that and the
    exchange's addresses made once: 322 -> 286 for nvfp4 x nvfp4, 246 -> 208 for bf16 x mxfp4). H100, old / new / old
    in one process each (bench/results/h100_mma_m{1,16}_hoisted_addresses_policies_ab_*_4d221fb_2026-11-26.log), us:
    M = 16, 8192^2, nvfp4 x nvfp4 18.7 / 17.8 / 18.6, mxfp4 x mxfp4 18.1 / 17.1 / 18.0, mxfp8 x mxfp4 18.1 / 17.3 /
    18.4, bf16 x mxfp4 16.4 / 16.1 / 16.6, bf16 x mxfp8 27.1 / 27.7 / 27.0; 10240 x 8192 (new / old) fp4 x fp4
    24.3 / 25.1, 23.5 / 24.4, 23.9 / 24.6, bf16 x mxfp4 22.9 / 22.4; M = 1, 8192^2, fp4 x fp4 within 0.1-0.2, bf16
    x nvfp4 15.7 / 16.8 / 15.7 and bf16 x mxfp4 15.2 / 16.5 / 15.2 (ptxas issued a weight load after the decode had
    begun). So fp4 and fp8 activations on fp4 weights at 1 < M <= 16."""
    return narrow and not fp8_weights and 1 < m <= MMA_WARP_M



# ---- plan objects ------------------------------------------------------------------------------------------------

class Predecode(NamedTuple):
    """An mma plan's decode of its fp4 / fp8 activation (`dequantize.dequantize_kernel`) before the mma kernel."""

    launch: object  # the compiled launcher (None until the plan's first call); the rows: the plan's `workspace.rows`


class MmaPlan(NamedTuple):
    """What one mma cache key launches; `launch` is None until first compiled."""

    launch: object
    cfg: object  # the Helion config (warps, unroll)
    consts: tuple  # the kernel's constexpr arguments: a named tuple in its signature order (`mma_constants`)
    split: int  # split-K factor
    m: int  # activation rows (which of the two kernels)
    workspace: ScratchSpec | None  # split > 1: float32 sums and int32 tickets, zero on entry (scratch, per call)
    predecode: Predecode | None = None  # mma: the activation's decode to bf16 before the kernel



# ---- options and rules -------------------------------------------------------------------------------------------

def _mma_column_groups(m: int) -> int:
    """B operands of 8 activation rows each (the kernel's COL_GROUPS): 8 per 64-row tile above M = 64."""
    return -(-min(m, MMA_M64_B_ROWS) // 8)


class MmaOptions(NamedTuple):
    max_split: int  # split-K cap
    programs_per_sm: int  # resident programs per SM for the wave rule (`_mma_split`); 0: the largest split
    row_groups: int  # 16-row groups per warp (ROW_GROUPS)
    shared_b: bool  # the program's threads decode B once and share it through shared memory
    wgmma: bool  # M > MMA_WARP_M: wgmma where the device has it (else mma.sync)
    ahead: int  # windows loaded ahead (AHEAD)
    k_warps: int  # warps (K slices of 4 warps with shared B) splitting K inside a program (K_WARPS; > 1: split 1)
    stage_b: bool | None  # each warp decodes its K range of B into shared memory once (STAGE_B); None: by the plan
    unroll: int  # windows per K-loop iteration (LLVM unrolls the loop by this factor); 0: by the plan
    tile_m: int  # M > MMA_M64_B_ROWS: activation rows per program of mma_m64_kernel (TILE_M: 64, or 128 with wgmma)
    cluster: bool  # split-K: the split parts sum in a thread-block cluster where they can (CLUSTER)
    split: int  # split-K factor as given (any 1 .. K / 64 at M <= MMA_WARP_M without ahead); 0: by max_split and the rule
    evict: bool  # L2 eviction hints: weights evict_first, activation evict_last (EVICT)
    hoist: bool  # with evict: hinted loads in inline PTX, their policies made once before the K loop (EVICT 2)
    pdl: bool | None  # programmatic dependent launch where the device has it (PDL, `launch.DirectLaunch`); None: by the plan
    pdl_prefetch: int  # with pdl at M <= MMA_WARP_M: windows of weights each warp asks L2 for before the grid wait
    fragment_sums: bool  # M > MMA_WARP_M, split-K in the workspace: sums in fragment order, vector reductions (FRAGMENT_SUMS)
    wide_b: bool = False  # M > MMA_WARP_M, bf16 / fp8 activations: a thread's B share in 16-byte loads (WIDE_B)
    predecode: bool = False  # fp4 / fp8 activations decoded to bf16 by a kernel of their own, then the bf16 plan
    warps: int = 8  # M > MMA_WARP_M: warps of mma_m64_kernel, 16 weight rows each (WARPS: 8, or 16 with tile_m 128)
    preload: bool = False  # M <= MMA_WARP_M: a warp loads all its windows' words before the first mma (PRELOAD)


def _mma_options(config, m: int, n: int, narrow: bool, fp8_weights: bool = False, aligned: bool = False) -> MmaOptions:
    """The plan options of `config` (None: the defaults), checked against the keys below; any other key is refused.

    | key           | M         | values                  | default (rule)                                            |
    |---------------|-----------|-------------------------|-----------------------------------------------------------|
    | max_split     | any       | int >= 1                | MMA_MAX_SPLIT / MMA_M64_MAX_SPLIT with the wave rule      |
    | split         | any       | 1 .. K / 64             | by max_split and the wave rule (`_mma_split`)             |
    | row_groups    | <= 16     | 1, 2 (2: N % 128 == 0)  | MMA_ROW_GROUPS                                            |
    | shared_b      | <= 16     | bool                    | MMA_SHARED_B                                              |
    | ahead         | any       | 0 .. 1 (M > 16: 1 .. 3) | MMA_AHEAD / MMA_M64_AHEAD, or by `_mma_k_slices`          |
    | k_warps       | <= 16     | 1, 2, 4, 8, 16          | `_mma_k_warps` (M = 1), `_mma_k_slices` (1 < M <= 16)     |
    | stage_b       | <= 8      | bool (fp4/fp8 act.)     | `_mma_stage_b` at M = 1                                   |
    | unroll        | any       | 1, 2                    | MMA_UNROLL, MMA_M64_UNROLL_K, or by `_mma_k_slices`       |
    | wgmma         | > 16      | bool                    | True (where the device has it)                            |
    | tile_m        | > 64      | 64, 128                 | 128 up to MMA_TILE_128_MAX_M                              |
    | cluster       | any       | bool                    | True: split-K parts sum in clusters where they can        |
    | evict, hoist  | any       | bool                    | MMA_EVICT up to M = 16; `_mma_hoist`                      |
    | pdl           | any       | bool                    | MMA_PDL up to M = 16 (`_mma_pdl_by_plan`)                 |
    | pdl_prefetch  | <= 16     | 0 .. 4 (with pdl)       | MMA_PDL_PREFETCH                                          |
    | fragment_sums | > 16      | bool                    | MMA_M64_FRAGMENT_SUMS                                     |
    | wide_b        | > 16      | bool (16-byte aligned)  | MMA_M64_WIDE_B                                            |
    | predecode     | any       | bool (fp4/fp8 act.)     | `_mma_predecode`: on fp4 weights above M = 16             |
    | warps         | > 64      | 8, 16 (16: tile_m 128)  | 16 with tile_m 128 from MMA_M64_WARPS_16_MIN_M rows at    |
    |               |           |                         | N % 256 == 0, else 8 (MMA_M64_WARPS); 8 without wgmma     |
    | preload       | <= 16     | bool (no shared / staged| False (`_mma_plan` checks that a warp's windows' words fit |
    |               |           | B, no ahead, even parts)|  MMA_PRELOAD_MAX_REGISTERS)                               |

    Above M = 16 a warp runs one row group with shared B. With "predecode" the activation is decoded to bf16 rows
    first and the bf16-activation options apply (`mma_options_for` lays the other keys over those). `narrow`: fp4 /
    fp8 activations; `aligned`: the activation's data is 16-byte aligned."""
    if config is None:
        return _default_mma_options(m, n, narrow, fp8_weights, aligned)
    keys = {"max_split", "split", "row_groups", "shared_b", "wgmma", "ahead", "k_warps", "stage_b", "unroll", "tile_m",
            "cluster", "evict", "hoist", "pdl", "pdl_prefetch", "fragment_sums", "wide_b", "predecode", "warps",
            "preload"}
    if not isinstance(config, dict) or not set(config) <= keys:
        raise ValueError("config: the mma backend takes a dict of 'max_split', 'split', 'row_groups', 'shared_b', 'wgmma', "
                         f"'ahead', 'k_warps', 'stage_b', 'unroll', 'tile_m', 'cluster', 'evict', 'hoist', 'pdl', "
                         f"'pdl_prefetch', 'fragment_sums', 'wide_b', 'predecode', 'warps' and 'preload', or None, got {config!r}")
    predecode = config.get("predecode", _mma_predecode(m, narrow, fp8_weights))
    if type(predecode) is not bool or (predecode and not narrow):
        raise ValueError(f"config: predecode is a bool, True only for fp4 / fp8 activations, got {config!r}")
    split = config.get("split", 0)
    if "split" in config and (type(split) is not int or split < 1 or "max_split" in config):
        raise ValueError(f"config: split is an int >= 1, without 'max_split', got {config!r} at M = {m}")
    wide_m = m > MMA_WARP_M
    auto = (m == 1 and not narrow and not set(config) & {"max_split", "split", "shared_b", "ahead"}) or (
        1 < m <= MMA_WARP_M and not set(config) & {"max_split", "split", "shared_b", "ahead", "row_groups"})
    k_warps = config.get("k_warps", 0 if auto else 1)  # 0: by `_mma_k_warps` / `_mma_k_slices` once K is known
    if "k_warps" in config and (k_warps not in (1, 2, 4, 8, 16) or type(k_warps) is not int):
        raise ValueError(f"config: k_warps must be 1, 2, 4, 8 or 16, got {k_warps!r}")
    if k_warps > 1 and (wide_m or "max_split" in config or split > 1):
        raise ValueError(f"config: k_warps > 1 runs at M <= {MMA_WARP_M} without 'max_split' or 'split' (split 1), got {config!r} "
                         f"at M = {m}")
    if wide_m:
        if config.get("row_groups", 1) != 1 or config.get("shared_b", True) is not True:
            raise ValueError(f"config: above M = {MMA_WARP_M} the mma kernel runs row_groups 1 with shared_b True, "
                             f"got {config!r}")
        # the mma.sync count; the plan takes wgmma's where the device runs it
        programs_per_sm = MMA_M64_PROGRAMS_PER_SM[False, narrow and not fp8_weights]
        row_groups, default_split, shared_b = 1, MMA_M64_MAX_SPLIT, True
    else:
        if "wgmma" in config:
            raise ValueError(f"config: 'wgmma' applies above M = {MMA_WARP_M}, got it at M = {m}")
        col_groups = _mma_column_groups(m)
        row_groups = int(config.get("row_groups", MMA_ROW_GROUPS[narrow, col_groups] if n % 128 == 0 else 1))
        if row_groups not in (1, 2) or n % (64 * row_groups):
            raise ValueError(f"config: row_groups must be 1 or 2 with N % (64 * row_groups) == 0, got {row_groups} at N={n}")
        default_split = MMA_MAX_SPLIT[col_groups, row_groups]
        programs_per_sm = MMA_PROGRAMS_PER_SM.get((narrow, col_groups, row_groups), 0)
        if fp8_weights and col_groups == 2:
            default_split, programs_per_sm = MMA_FP8_M16_MAX_SPLIT, 0
        shared_b = config.get("shared_b", MMA_SHARED_B[narrow, col_groups] and not config.get("preload"))
    max_split = int(config.get("max_split", default_split if k_warps <= 1 else 1))
    if max_split < 1:
        raise ValueError(f"config: max_split must be >= 1, got {max_split}")
    wgmma, cluster = config.get("wgmma", wide_m), config.get("cluster", wide_m or MMA_GEMV_CLUSTER)
    evict = config.get("evict", MMA_EVICT and not wide_m)
    hoist = config.get("hoist", evict is True and _mma_hoist(m, narrow, fp8_weights))
    pdl = config.get("pdl", MMA_PDL and not wide_m)
    fragment_sums = config.get("fragment_sums", wide_m and MMA_M64_FRAGMENT_SUMS)
    for name, value in (("shared_b", shared_b), ("wgmma", wgmma), ("cluster", cluster), ("evict", evict), ("hoist", hoist),
                        ("pdl", pdl), ("fragment_sums", fragment_sums)):
        if not isinstance(value, bool):
            raise ValueError(f"config: {name} must be a bool, got {value!r}")
    if fragment_sums and not wide_m:
        raise ValueError(f"config: fragment_sums applies above M = {MMA_WARP_M}, got {config!r} at M = {m}")
    pdl_prefetch = config.get("pdl_prefetch",
                              MMA_PDL_PREFETCH[fp8_weights, _mma_column_groups(m)] if pdl and not wide_m else 0)
    if type(pdl_prefetch) is not int or not 0 <= pdl_prefetch <= 4 or (pdl_prefetch and (not pdl or wide_m)):
        raise ValueError(f"config: pdl_prefetch is an int in 0 .. 4, with pdl at M <= {MMA_WARP_M}, got {config!r} at M = {m}")
    if pdl and not {"pdl", "pdl_prefetch"} & set(config):
        pdl = None  # by the plan (`_mma_pdl_by_plan`)
    if hoist and not evict:
        raise ValueError(f"config: hoist applies to the eviction hints, which evict False turns off, got {config!r}")
    ahead = config.get("ahead", MMA_M64_AHEAD if wide_m else MMA_AHEAD)
    low, high = (1, 3) if wide_m else (0, int(shared_b))
    if type(ahead) is not int or not low <= ahead <= high:
        raise ValueError(f"config: ahead must be an int in {low} .. {high} at M = {m}"
                         f"{'' if wide_m or shared_b else ' without shared_b'}, got {ahead!r}")
    if shared_b and k_warps > 8:  # (above MMA_WARP_M k_warps > 1 was refused)
        raise ValueError(f"config: k_warps with shared_b is at most 8 (slices of 4 warps, 32 in all), got {config!r}")
    stage_b = config.get("stage_b", None if m == 1 and narrow and not set(config) - LAUNCH_ONLY_KEYS else False)
    if stage_b is not None and not isinstance(stage_b, bool):
        raise ValueError(f"config: stage_b must be a bool, got {stage_b!r}")
    if stage_b and not (narrow and not wide_m and _mma_column_groups(m) == 1 and k_warps > 1 and not shared_b):
        raise ValueError("config: stage_b runs fp4 / fp8 activations at M <= 8 with 'k_warps' > 1 and 'shared_b' False, "
                         f"got {config!r} at M = {m}{'' if narrow else ' with bf16 activations'}")
    unroll = config.get("unroll", 0)
    if "unroll" in config and (unroll not in (1, 2) or type(unroll) is not int):
        raise ValueError(f"config: unroll must be 1 or 2, got {unroll!r}")
    tile_128 = m > MMA_M64_B_ROWS and wgmma and ahead == 1  # where 128 activation rows per program can run
    sixteen = (tile_128 and _m64_sixteen_warps_programs(m, n) > 0
               and not set(config) & {"warps", "tile_m", "fragment_sums", "cluster"})  # the 16-warp default
    tile_m = config.get("tile_m", 2 * MMA_M64_B_ROWS if tile_128 and (m <= MMA_TILE_128_MAX_M or sixteen)
                        else MMA_M64_B_ROWS)
    if type(tile_m) is not int or tile_m not in (MMA_M64_B_ROWS, 2 * MMA_M64_B_ROWS) or (
            tile_m > MMA_M64_B_ROWS and not tile_128):
        raise ValueError(f"config: tile_m must be 64, or 128 above M = 64 with wgmma and ahead 1, got {config!r} "
                         f"at M = {m}")
    # (the 16-byte loads carry no L2 eviction hint: with "evict" the four hinted ones)
    wide_b = config.get("wide_b", MMA_M64_WIDE_B and wide_m and aligned and not evict)
    if "wide_b" in config and (type(wide_b) is not bool or (wide_b and (not wide_m or not aligned or evict))):
        raise ValueError(f"config: wide_b is a bool, True only above M = {MMA_WARP_M} with bf16 or fp8 activations whose "
                         f"data is 16-byte aligned and without evict, got {config!r} at M = {m}")
    warps = config.get("warps", 16 if sixteen else MMA_M64_WARPS)
    if type(warps) is not int or warps not in (8, 16) or (warps == 16 and (
            tile_m != 2 * MMA_M64_B_ROWS or config.get("fragment_sums") or config.get("cluster"))):
        raise ValueError(f"config: warps is 8, or 16 with tile_m 128 (above M = {MMA_M64_B_ROWS}, wgmma, ahead 1) and "
                         f"neither fragment_sums nor cluster, got {config!r} at M = {m}")
    if warps == 16:  # (the fragment-order workspace and the cluster sums are laid out for 256 threads)
        fragment_sums, cluster = False, False
    preload = config.get("preload", False)
    if type(preload) is not bool or (preload and (wide_m or shared_b or stage_b or ahead)):
        raise ValueError(f"config: preload is a bool, True only at M <= {MMA_WARP_M} without shared_b, stage_b or ahead, "
                         f"got {config!r} at M = {m}")
    return MmaOptions(max_split, 0 if "max_split" in config or k_warps > 1 else programs_per_sm, row_groups, shared_b,
                      wgmma, ahead, k_warps, stage_b, unroll, tile_m, cluster, split, evict, hoist, pdl, pdl_prefetch,
                      fragment_sums, wide_b, predecode, warps, preload)


def mma_options_for(config, a, b: QTensor, m: int, n: int) -> MmaOptions:
    """`_mma_options` for activation `a` [m, K] and "mma_m16k16" weights `b` [n, K] (what
    `scaled_mm` runs); bf16 and fp8 activations above M = 16 are checked for 16-byte alignment (`MMA_M64_WIDE_B`)."""
    return _options_of(config, m, n, isinstance(a, QTensor), not b.fmt.is_packed, _aligned(a, m))


def _aligned(a, m: int) -> bool:
    """Whether 16-byte loads of a thread's activation share may read `a`'s data (above M = 16; bf16 and fp8, not
    fp4: one word)."""
    narrow = isinstance(a, QTensor)
    return m > MMA_WARP_M and not (narrow and a.fmt.is_packed) and (a.data if narrow else a).data_ptr() % 16 == 0


def _options_of(config, m: int, n: int, narrow: bool, fp8_weights: bool, aligned: bool) -> MmaOptions:
    """`mma_options_for` from the activation's and weights' properties."""
    options = _mma_options(config, m, n, narrow, fp8_weights, aligned)
    if options.predecode:  # the bf16-activation options, over rows from scratch.get (16-byte aligned)
        rest = {key: value for key, value in config.items() if key != "predecode"} if config else None
        options = _mma_options(rest or None, m, n, False, fp8_weights, m > MMA_WARP_M)._replace(predecode=True)
    return options


@functools.lru_cache(maxsize=None)
def _default_mma_options(m: int, n: int, narrow: bool, fp8_weights: bool, aligned: bool = False) -> MmaOptions:
    """`_mma_options` without a config, once per shape: it runs on every call. With this and
    the flat `kernel_words`, the mma path of `scaled_mm` without the launch went from 146,837
    to 94,340 x86 instructions per call (callgrind, bf16 x nvfp4, M = 1, 2-core CPU machine)."""
    return _mma_options({}, m, n, narrow, fp8_weights, aligned)


# Per-shape caches of options made from this module's flags (MMA_PDL, MMA_PDL_PREFETCH, ...): a flag set after a first
# call changes nothing until they are emptied (`clear_option_caches`); `api` adds its tuned-options cache.
OPTION_CACHES = [_default_mma_options]


def clear_option_caches() -> None:
    """Empty the caches of OPTION_CACHES, so that the next calls plan from the module flags as they are now (an A / B
    of a flag in one process: `bench.layer_chain`'s PDL on / off)."""
    for cache in OPTION_CACHES:
        cache.cache_clear()


def _split_starved(windows: int) -> bool:
    """Whether no split-K of MMA_SPLIT_UNEVEN_BELOW divides the K / 64 windows (where uneven parts and warps pay)."""
    return windows % MMA_SPLIT_UNEVEN_BELOW != 0


def _mma_split(windows: int, row_programs: int, max_split: int, programs_per_sm: int, device: torch.device,
               unsplit_waves: float = 0, uneven: bool = False, parts: bool = False) -> int:
    """Split-K factor: a power of two <= max_split dividing the 64-K windows (with `parts`, where 8 does not
    divide them, any up to the windows: parts of W // split or one more window, `MMA_SPLIT_UNEVEN_BELOW`); the largest, or
    with `programs_per_sm` resident the smallest whose last wave of programs is >= 90% full
    (else the fullest), and 1 where the unsplit programs fill `unsplit_waves` (if given) of a wave.
    With `uneven` (mma_m64_kernel), where that split leaves one wave under 90% full, the largest factor
    <= max_split whose programs still fit one wave if they fill 90% of it (`MMA_M64_UNEVEN_SPLIT`)."""
    any_part = parts and _split_starved(windows)
    splits = [s for s in (1, 2, 4, 8, 16, 32, 64) if s <= min(max_split, windows) and (any_part or windows % s == 0)]
    if not programs_per_sm:
        return splits[-1]
    resident = programs_per_sm * _sm_count(device)
    if unsplit_waves and row_programs >= unsplit_waves * resident:
        return 1

    def fill(s):
        waves = row_programs * s / resident
        return waves / -(-waves // 1)

    split = next((s for s in splits if fill(s) >= 0.9), max(splits, key=fill))
    one_wave = min(max_split, windows, resident // row_programs)
    if uneven and row_programs * split < 0.9 * resident <= row_programs * one_wave:
        return one_wave
    return split


def _mma_k_warps(windows: int, programs: int, device: torch.device, uneven: bool = False) -> int:
    """K_WARPS by `MMA_K_WARPS`: the first that divides the windows and whose `programs` (64 // k_warps
    resident per SM: <= 32 registers, `tests/test_bench.py`) fill 0.5 (up to MMA_K_WARPS_SHORT_WINDOWS
    windows: MMA_K_WARPS_SHORT_MIN_WAVES) to 1 wave or make >= 3; else, if `uneven` (the plan can take a tail), the
    first that does not divide them, from MMA_K_WARPS_UNEVEN_MIN_WAVES to 1 wave or >= 3; else 1."""
    least = MMA_K_WARPS_SHORT_MIN_WAVES if windows <= MMA_K_WARPS_SHORT_WINDOWS else 0.5
    for divides, low in ((True, least), (False, MMA_K_WARPS_UNEVEN_MIN_WAVES))[:2 if uneven else 1]:
        for k_warps in MMA_K_WARPS:
            waves = programs / (64 // k_warps * _sm_count(device))
            if (windows % k_warps == 0) == divides and k_warps <= windows and (low <= waves <= 1 or waves >= 3):
                return k_warps
    return 1


def _mma_k_slices(windows: int, n: int, device: torch.device, two_groups: bool = True) -> tuple[int, int, int, int] | None:
    """(K slices, row groups, ahead and unroll for fp4 weights) at 1 < M <= 16 by `MMA_K_SLICES`: 4 slices of two
    row groups where their programs (2 resident per SM) make at least one wave (only if `two_groups`:
    8 < M <= 16), else 8 of one where theirs (1 per SM)
    fill 0.9 to 1 wave; only up to MMA_K_SLICES_MAX_WINDOWS windows. Else None: split-K."""
    sms = _sm_count(device)
    if windows <= MMA_K_SLICES_MAX_WINDOWS:
        for slices, row_groups, resident, low, high, ahead, unroll in MMA_K_SLICES:
            if row_groups == 2 and not two_groups:
                continue
            programs = n // (64 * row_groups)
            if windows % slices == 0 and n % (64 * row_groups) == 0 and low <= programs / (resident * sms) <= high:
                return slices, row_groups, ahead, unroll
    return None


# At 8 < M <= 16 where 4 K slices of two row groups would make >= 1 wave: split-K by the wave rule summed in clusters
# (57344 x 8192, M = 16, mxfp4 x mxfp4: 2.90x -> 3.20x; at 8192 x 28672 it lost, 2.88-3.07x -> 2.43-2.64x).
def _mma_m16_cluster_split(windows: int, n: int, row_groups: int, narrow: bool, cluster: bool,
                           device: torch.device) -> int:
    """At 8 < M <= 16 (two column groups): the split-K factor of programs of 4 warps on
    `row_groups` row groups (the wave rule with `MMA_PROGRAMS_PER_SM`, at most CLUSTER_MAX_CTAS) where its parts sum
    in thread-block clusters (`_mma_gemv_cluster`, if `cluster`), else 0."""
    row_programs = n // (64 * row_groups)
    split = _mma_split(windows, row_programs, CLUSTER_MAX_CTAS, MMA_PROGRAMS_PER_SM[narrow, 2, row_groups], device)
    return split if cluster and _mma_gemv_cluster(split, _mma_gemv_values(row_groups, 2), row_programs * split, device) else 0


# 8 < M <= 16: one row group with split-K in clusters where two row groups would split into the workspace on
# under 0.9 of a wave (4096^2, bf16 x mxfp4: 9.4 -> 7.2 us); fp4 / fp8 activations on fp4 weights up to K = 4096.
MMA_ONE_GROUP_FILL = 0.9
MMA_ONE_GROUP_FP4_ON_FP4_MAX_WINDOWS = 64


def _mma_m16_one_group_split(windows: int, n: int, m: int, narrow: bool, fp4_on_fp4: bool, options: MmaOptions,
                             device: torch.device) -> int:
    """At 8 < M <= 16 with two row groups by default: the split-K factor (<= CLUSTER_MAX_CTAS, dividing the windows)
    of programs of one row group summed in clusters, where the two-row-group split by `options` would sum in the
    workspace on less than MMA_ONE_GROUP_FILL of a wave (`MMA_PROGRAMS_PER_SM` resident) and the clusters can run
    (fp4 / fp8 activations on fp4 weights: up to MMA_ONE_GROUP_FP4_ON_FP4_MAX_WINDOWS windows); else 0."""
    if (_mma_column_groups(m) != 2 or options.row_groups != 2 or not options.cluster  # (two row groups: N % 128 == 0)
            or (fp4_on_fp4 and windows > MMA_ONE_GROUP_FP4_ON_FP4_MAX_WINDOWS)):
        return 0
    pairs = n // 128
    split = _mma_split(windows, pairs, options.max_split, options.programs_per_sm, device)
    resident = MMA_PROGRAMS_PER_SM[narrow, 2, 2] * _sm_count(device)
    if (_mma_gemv_cluster(split, _mma_gemv_values(2, 2), pairs * split, device)
            or pairs * split >= MMA_ONE_GROUP_FILL * resident):
        return 0
    split = _mma_split(windows, n // 64, CLUSTER_MAX_CTAS, 0, device)
    return split if _mma_gemv_cluster(split, _mma_gemv_values(1, 2), n // 64 * split, device) else 0


# Staged B for fp4 / fp8 activations at M = 1: each warp decodes its K range of the activation into shared memory
# once (nvfp4 x nvfp4, M = 1, 8192^2: 2.51x -> 2.89x); 8192 x 28672 (57 KB of B) keeps split-K.
def _mma_stage_b(m: int, k: int, k_warps: int) -> bool:
    """Whether a staged B (`mma_gemv.staged_b`) of M rows fits: at most MMA_STAGED_B_MAX_BYTES, and
    at most 16 16-element chunks a lane (`staged_b_chunks`: M x steps / 8, rounded up)."""
    steps = k // 64 // k_warps
    return k_warps > 1 and staged_b_bytes(m, k) <= MMA_STAGED_B_MAX_BYTES and staged_b_chunks(m, steps) in MMA_STAGED_B_STORE_PTX


def _mma_plan(a, b: QTensor, has_bias: bool, m: int, n: int, k: int, options: MmaOptions) -> MmaPlan:
    """The MmaPlan of one mma cache key: split-K over the 64-K windows, one program per
    64 * row_groups rows (M > MMA_WARP_M: 16 rows a warp, 8 or 16 warps), or with k_warps > 1
    one program of k_warps warps per 16 * row_groups rows (with shared B k_warps K slices of 4
    warps per 64 * row_groups rows) and no split. Where the options leave k_warps 0 it comes from
    `_mma_k_slices` at 1 < M <= 16 (with its row groups, shared B, and for fp4 weights its ahead and, unless
    the options give one, its unroll;
    split-K where it gives none: of one row group in clusters with one window ahead where
    `_mma_m16_one_group_split` says so, else one window ahead for fp8 weights at 8 < M <= 16 from K =
    MMA_FP8_M16_AHEAD_K),
    else from `_mma_k_warps`. Above M = MMA_WARP_M fp4 weights take two
    windows per K-loop iteration from K = MMA_M64_UNROLL_K, unless the options give "unroll", and above M =
    MMA_TILE_128_MAX_M no split once the programs fill MMA_M64_UNSPLIT_WAVES of a wave. Where they
    leave stage_b None (fp4 / fp8 activations at M = 1), B is staged with one row group, no shared B and
    `_mma_k_warps`'s warps where `_mma_stage_b` allows it."""
    if options.predecode:  # the bf16-activation plan, over the activation decoded into each call's scratch rows
        plan = _mma_plan(None, b, has_bias, m, n, k, options._replace(predecode=False))
        rows = (m, k // a.fmt.block_size, a.fmt.block_size)
        return plan._replace(predecode=Predecode(None), workspace=(plan.workspace or ScratchSpec())._replace(rows=rows))
    wide_m = m > MMA_WARP_M
    fp4_on_fp4 = isinstance(a, QTensor) and b.fmt.is_packed  # fp4 / fp8 activations on fp4 weights
    if options.stage_b is None:
        k_warps = _mma_k_warps(k // 64, n // 16, b.device)
        staged = _mma_stage_b(m, k, k_warps)
        options = options._replace(stage_b=staged, **(dict(row_groups=1, shared_b=False, ahead=0, k_warps=k_warps,
                                                           max_split=1, programs_per_sm=0) if staged else {}))
        # where split-K has no 8-way split either (8192 x 29568, 462 windows: 162.5 -> 66.1 us; at 3584 x 18944, 296
        # windows, split 8 stays: 16 uneven warps were not the fastest there), the tail's warps: on fp4 weights over
        # the activation decoded to bf16 first (`MMA_PREDECODE_TAIL`), else with B unstaged and unshared
        starved = not staged and _split_starved(k // 64)
        uneven = _mma_k_warps(k // 64, n // (16 * options.row_groups), b.device, True) if starved else 1
        if (k // 64) % uneven:
            if MMA_PREDECODE_TAIL and fp4_on_fp4:
                bf16 = _default_mma_options(m, n, False, False)._replace(
                    evict=options.evict, hoist=options.hoist, pdl=options.pdl, pdl_prefetch=options.pdl_prefetch)
                return _mma_plan(a, b, has_bias, m, n, k, bf16._replace(predecode=True))
            options = options._replace(shared_b=False, ahead=0, k_warps=uneven, max_split=1, programs_per_sm=0)
    if options.stage_b and not _mma_stage_b(m, k, options.k_warps):
        raise ValueError(f"config: stage_b needs M x (2 K + 16) <= {MMA_STAGED_B_MAX_BYTES} bytes and M x K / 64 / k_warps "
                         f"from 1 to 128 (a warp's 16-K chunks over 32 lanes, at most 16 each), got M = {m}, K = {k}, k_warps {options.k_warps}")
    if not options.k_warps and m > 1:  # 1 < M <= 16: K slices or split-K
        slices = _mma_k_slices(k // 64, n, b.device, _mma_column_groups(m) == 2)
        narrow = isinstance(a, QTensor)
        cluster_split = (slices and slices[1] == 2
                         and _mma_m16_cluster_split(k // 64, n, slices[1], narrow, options.cluster, b.device))
        if cluster_split:  # split-K in clusters instead of 4 K slices of two row groups
            options = options._replace(k_warps=1, split=cluster_split, row_groups=slices[1])
        elif slices:
            slices, row_groups, *fp4_tail = slices
            ahead, unroll = fp4_tail if b.fmt.is_packed else (0, 1)
            if (slices, row_groups) == (8, 1) and not (b.fmt.is_packed or narrow) and _mma_column_groups(m) == 2:
                slices, ahead, unroll = MMA_BF16_FP8_M16_SLICES
            options = options._replace(k_warps=slices, row_groups=row_groups, shared_b=True, ahead=ahead,
                                       unroll=options.unroll or unroll)
        elif one_group := _mma_m16_one_group_split(k // 64, n, m, narrow, fp4_on_fp4, options, b.device):
            options = options._replace(k_warps=1, row_groups=1, split=one_group, ahead=1)
        else:  # split-K; fp8 weights at 8 < M <= 16 with long K load one window ahead
            fp8_ahead = (not b.fmt.is_packed and _mma_column_groups(m) == 2 and k >= MMA_FP8_M16_AHEAD_K
                         and not _split_starved(k // 64))  # else uneven parts, which load none ahead
            options = options._replace(k_warps=1, ahead=1 if fp8_ahead else options.ahead)
    elif not options.k_warps:
        uneven = not (options.shared_b or options.stage_b or options.ahead)
        options = options._replace(k_warps=_mma_k_warps(k // 64, n // (16 * options.row_groups), b.device, uneven))
    if (k // 64) % options.k_warps and (options.shared_b or options.stage_b or options.ahead or wide_m
                                        or options.k_warps > k // 64):
        raise ValueError(f"config: k_warps {options.k_warps} must divide the K / 64 = {k // 64} windows, or with "
                         f"shared_b, stage_b and ahead off be at most that many (the first K / 64 mod k_warps warps "
                         f"take one window more)")
    from .mma_gemv import fragment_workspace_sums, program_row_warps  # per cache key, not per call

    wgmma = wide_m and options.wgmma and _has_wgmma(b.device)
    if not wgmma:  # 128 activation rows per program (and so 16 warps) take wgmma's second descriptor
        options = options._replace(tile_m=MMA_M64_B_ROWS, warps=MMA_M64_WARPS)
    if options.warps == 16 and not (wgmma and options.tile_m > MMA_M64_B_ROWS and n % (16 * options.warps) == 0):
        raise ValueError(f"config: warps 16 runs wgmma with tile_m 128 on N % 256 == 0 (stored), got N = {n}")
    if wide_m and options.programs_per_sm:  # the wave rule: resident programs of the kernel that runs
        options = options._replace(programs_per_sm=MMA_M64_WARPS_16_PROGRAMS_PER_SM if options.warps == 16
                                   else MMA_M64_TILE_128_PROGRAMS_PER_SM
                                   if options.tile_m > MMA_M64_B_ROWS else MMA_M64_PROGRAMS_PER_SM[wgmma, fp4_on_fp4])
    row_warps = program_row_warps(options.k_warps, options.shared_b)
    # mma_m64_kernel: a program per 16 x warps weight rows and tile_m activation rows
    row_programs = (n // (16 * options.warps) * -(-m // options.tile_m) if wide_m
                    else n // (16 * row_warps * options.row_groups))
    if options.split and (options.split > k // 64 or (k // 64 % options.split and options.ahead and not wide_m)):
        raise ValueError(f"config: split {options.split} must be at most the K / 64 = {k // 64} windows and, with "
                         f"ahead {options.ahead} at M <= {MMA_WARP_M}, divide them")
    split = options.split or (1 if options.k_warps > 1 else _mma_split(
        k // 64, row_programs, options.max_split, options.programs_per_sm, b.device,
        MMA_M64_UNSPLIT_WAVES if m > MMA_TILE_128_MAX_M else 0, wide_m and MMA_M64_UNEVEN_SPLIT,
        parts=wide_m or not options.ahead))  # (mma_gemv_kernel's windows ahead assume even parts)
    steps = k // 64 // (split * options.k_warps)
    if options.preload and (options.shared_b or options.stage_b or options.ahead or (k // 64) % split or steps < 1
                            or steps * _mma_preload_registers(a, b, m, options.row_groups) > MMA_PRELOAD_MAX_REGISTERS):
        raise ValueError(f"config: preload needs a split dividing the K / 64 = {k // 64} windows and a warp's windows' "
                         f"words in at most {MMA_PRELOAD_MAX_REGISTERS} registers "
                         f"({_mma_preload_registers(a, b, m, options.row_groups)} a window here), without shared_b, "
                         f"stage_b or ahead, got split {split}, k_warps {options.k_warps}: {steps} windows a warp")
    act_elem, act_scale, block_a, a_layout = operand_codes(a.fmt, a.layout) if isinstance(a, QTensor) else operand_codes(None)
    cluster = options.cluster and (
        wgmma and _mma_cluster(m, split, options.tile_m, row_programs * split, b.device) if wide_m
        else _mma_gemv_cluster(split, _mma_gemv_values(options.row_groups, _mma_column_groups(m)), row_programs * split,
                               b.device))
    w_elem, w_scale = operand_codes(b.fmt)[:2]
    common = dict(M=m, N=n, K=k, BLOCK=b.fmt.block_size, W_ELEM=w_elem, ENCODING=w_scale, ACT_ELEM=act_elem,
                  ACT_SCALE=act_scale, BLOCK_A=block_a, A_LAYOUT=a_layout, HAS_BIAS=has_bias,
                  EVICT=2 if options.hoist else int(options.evict),
                  PDL=1 + options.pdl_prefetch if _mma_pdl_by_plan(options.pdl, a, b, m, k // 64 // (split * options.k_warps))
                  and _has_pdl(b.device) else 0,
                  COL_GROUPS=_mma_column_groups(m), CLUSTER=cluster, SPLIT=split, AHEAD=options.ahead)
    if wide_m:
        consts = mma_constants(m)(**common, WGMMA=wgmma, TILE_M=options.tile_m, FRAGMENT_SUMS=options.fragment_sums,
                                  WIDE_B=options.wide_b, WARPS=options.warps)
    else:
        consts = mma_constants(m)(**common, ROW_GROUPS=options.row_groups, SHARED_B=options.shared_b,
                                  K_WARPS=options.k_warps, STAGE_B=options.stage_b, PRELOAD=options.preload)
    workspace = None
    if split > 1:  # mma_m64_kernel's fragment order: its column groups (COL_GROUPS x TILE_M / 64) of every output tile
        sums = (fragment_workspace_sums(row_programs, _mma_column_groups(m) * options.tile_m // MMA_M64_B_ROWS)
                if wide_m and options.fragment_sums else m * n)
        workspace = ScratchSpec(sums, row_programs)
    unroll = options.unroll or (2 if wide_m and b.fmt.is_packed and k >= MMA_M64_UNROLL_K else MMA_UNROLL)
    cfg = helion.Config(block_sizes=[], num_warps=options.warps if wide_m else row_warps * options.k_warps, num_stages=1,
                        **({"range_unroll_factors": [0, unroll]} if unroll > 1 else {}))
    return MmaPlan(None, cfg, consts, split, m, workspace)


def _mma_preload_registers(a, b: QTensor, m: int, row_groups: int) -> int:
    """32-bit registers one window's loaded words take per thread of mma_gemv_kernel: per row group 4 A words (fp4:
    int32, fp8: int64) and a factor word, per column group B's words (bf16: 4 int64; fp4: one int64 and a scale code;
    fp8: two and a scale code)."""
    b_regs = (3 if a.fmt.is_packed else 5) if isinstance(a, QTensor) else 8
    return row_groups * ((4 if b.fmt.is_packed else 8) + 1) + _mma_column_groups(m) * b_regs


def _cluster_sum_runs(split: int, values: int, threads: int, programs: int, device: torch.device) -> bool:
    """Whether SPLIT parts can sum `values` accumulators per thread of `threads`-thread CTAs in one thread-block
    cluster (`decode.MMA_CLUSTER_SUM_PTX`): split 2 .. CLUSTER_MAX_CTAS dividing them (one per CTA included), and
    more than MMA_CLUSTER_PROGRAMS_PER_SM programs per SM."""
    return (1 < split <= CLUSTER_MAX_CTAS and (values, split, threads) in MMA_CLUSTER_SUM_PTX
            and programs > MMA_CLUSTER_PROGRAMS_PER_SM * _sm_count(device))


def _mma_cluster(m: int, split: int, tile_m: int, programs: int, device: torch.device) -> bool:
    """Whether mma_m64_kernel's SPLIT parts of an output tile sum in a thread-block cluster: `_cluster_sum_runs` with
    its 4 x column groups accumulators on 256 threads, 64 activation rows per program, and the sums' slots beside
    the B windows in static shared memory."""
    values = 4 * _mma_column_groups(m)
    return (tile_m == MMA_M64_B_ROWS and _cluster_sum_runs(split, values, 256, programs, device)
            and cluster_sum_bytes(values, split) + m64_exchange_buffer(True)[0] <= MMA_CLUSTER_SHARED_BYTES)


def _mma_gemv_values(row_groups: int, col_groups: int) -> int:
    """fp32 accumulators per thread of mma_gemv_kernel: 4 per row group and column group."""
    return 4 * row_groups * col_groups


def _mma_gemv_cluster(split: int, values: int, programs: int, device: torch.device) -> bool:
    """Whether mma_gemv_kernel's SPLIT parts of a row of programs sum in a thread-block cluster (`MMA_GEMV_CLUSTER`):
    sm_90 and `_cluster_sum_runs` with its `values` accumulators on 128 threads."""
    return _has_wgmma(device) and _cluster_sum_runs(split, values, 128, programs, device)


def _mma_pdl_by_plan(pdl: bool | None, a, b: QTensor, m: int, windows: int) -> bool:
    """PDL as the options give it, or where they leave it to the plan (None) on, but off for E8M0-scaled fp4 / fp8
    activations on fp4 weights at 1 < M <= MMA_WARP_M whose programs run more than MMA_PDL_MX_ACT_MAX_WINDOWS
    windows each."""
    if pdl is not None:
        return pdl
    mx_act = isinstance(a, QTensor) and a.fmt.scale_encoding == "e8m0" and b.fmt.is_packed
    return not (mx_act and 1 < m <= MMA_WARP_M and windows > MMA_PDL_MX_ACT_MAX_WINDOWS)


def _mma_pdl(plan: MmaPlan) -> bool:
    """Whether an mma plan's kernel waits for the grid before it (its PDL) and so launches with PDL."""
    return plan.consts.PDL > 0


def _mma_cluster_size(plan: MmaPlan) -> int:
    """CTAs per thread-block cluster of an mma plan's launch: its split where it sums in clusters, else 1."""
    return plan.split if plan.consts.CLUSTER else 1


def mma_constants(m: int):
    """The named tuple of the constexpr parameters of `mma_kernel(m)`, in its signature's order: plans fill it by
    name, and its order is the kernel's."""
    return _kernel_constants(m > MMA_WARP_M)


@functools.lru_cache(maxsize=None)
def _kernel_constants(wide_m: bool):
    """`mma_constants` of one of the two kernels, built once each."""
    import collections
    import inspect

    kernel = mma_kernel(MMA_WARP_M + 1 if wide_m else 1)
    names = [name for name, p in inspect.signature(kernel.fn).parameters.items() if p.annotation in (hl.constexpr, "hl.constexpr")]
    return collections.namedtuple(f"{kernel.fn.__name__}_constants", names)


def mma_kernel(m: int):
    """The mma kernel that runs M rows of activations."""
    from .mma_gemv import mma_gemv_kernel, mma_m64_kernel  # here, not per call: 1.3-2 us of the wrapper's 8-10 (README)

    return mma_m64_kernel if m > MMA_WARP_M else mma_gemv_kernel
