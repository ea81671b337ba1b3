"""The mma kernels: fp4 / fp8 weights in the "mma_m16k16" layout on bf16 tensor cores; bf16, fp4 or fp8 activations.

| kernel            | M       | program                                    | MMA                                   |
|-------------------|---------|--------------------------------------------|---------------------------------------|
| `mma_gemv_kernel` | <= 16   | 4 warps x ROW_GROUPS 16-row weight groups  | mma.sync m16n8k16, activation as B    |
| `mma_m64_kernel`  | > 16    | WARPS x 16 rows, TILE_M activation rows    | wgmma m64nNk16 (sm_90), else mma.sync |

The weights are the A operand. Per 64-K window a thread loads one word per mma step (int32 of 8 E2M1 codes, int64 of
8 E4M3 codes: `blockscaled.layouts.mma`), places the codes under bf16's fields with 11 (E2M1) or 6 (E4M3) integer ops
and multiplies them by its rows' scale factors with bf16x2 FMAs (`decode.MMA_A_FRAGMENTS_PTX`): every element x
scale is exact in bf16, and the fp32 result is scaled by `post` = 2^shift x global scale at the end. fp4 / fp8
activations are decoded into the B registers the same way (`decode.MMA_B_FRAGMENTS_PTX`). mma.sync flushes bf16
subnormals: activation values below 2^-126 count as zero on these kernels (the other backends keep them).

The mma fragments tie values to lanes, which Triton's tensor layouts do not promise, so every tensor here holds one
value per thread (`[threads]`, indexed by the thread's own %tid.x) and each thread computes its addresses from its
lane: no value crosses threads outside the mma and the inline-PTX exchanges.

Constexpr knobs (the plan fills them by name, `plans.mma_constants`; why each default: `docs/PLANS.md`):

| knob          | what it does                                                                                   |
|---------------|------------------------------------------------------------------------------------------------|
| ROW_GROUPS    | 16-row weight groups per warp sharing one B (1 or 2)                                           |
| SHARED_B      | the program decodes each window's B once and shares it through shared memory (one barrier)     |
| STAGE_B       | each warp decodes its K range of the activation into shared memory once, before the K loop     |
| AHEAD         | windows whose words are loaded before the current one's barrier                                |
| PRELOAD       | no K loop: a warp loads every word of its few windows before the first mma (B per warp)        |
| SPLIT         | programs along K; sums added into `workspace` (zero on entry and exit), last ticket stores     |
| CLUSTER       | the SPLIT parts run as one thread-block cluster and sum through distributed shared memory      |
| K_WARPS       | K split inside the program (warps, or K slices of 4 warps with SHARED_B), summed in shared mem |
|               | (not dividing the K / 64 windows, without SHARED_B / STAGE_B: `tail_window` after the loop)    |
| EVICT         | L2 hints: weights evict_first, activation evict_last (2: inline PTX, policies made once)       |
| PDL           | touch no memory before `griddepcontrol.wait`, let the next kernel launch after the K loop;     |
|               | PDL - 1 windows of weights asked of L2 before the wait                                         |
| WGMMA, TILE_M | mma_m64_kernel: wgmma with the weights as register A; 64 or 128 activation rows per program    |
| FRAGMENT_SUMS | mma_m64_kernel's split-K workspace in fragment order (vector reductions)                       |
| WIDE_B        | mma_m64_kernel: a thread's bf16 / fp8 B share in 16-byte loads                                 |
| WARPS         | mma_m64_kernel: 8 warps (128 weight rows), or 16 (256, TILE_M 128: one B share a thread)       |

Launched by `launch.DirectLaunch` (clusters, programmatic dependent launch); the workspace, tickets and any predecoded
activation rows come from `scratch.get`, per stream and per CUDA-graph capture.
"""

from __future__ import annotations

import torch

import helion
import helion.language as hl

from blockscaled.formats import SCALE_LAYOUTS
from blockscaled.layouts import scale_offset

from .configs import KERNEL_SETTINGS
from .decode import (CLUSTER_ARRIVE_PTX, CLUSTER_WAIT_PTX, ELEMENT_CODES, FRAGMENT_ADD_PTX, FRAGMENT_LOAD_PTX,
                     FRAGMENT_ZERO_PTX, GRID_DEPENDENCY_WAIT_PTX,
                     LAUNCH_DEPENDENTS_PTX, MMA_A_FRAGMENTS_PTX, MMA_B_FRAGMENTS_PTX, MMA_CLUSTER_SUM_PTX, MMA_K_WARP_SUM_PTX,
                     MMA_M64_EXCHANGE_PTX, MMA_SHARED_B_ADDRESSES_PTX, MMA_SHARED_B_PTX, MMA_STAGED_B_LOAD_PTX, MMA_STAGED_B_STORE_PTX,
                     MMA_STEPS_M64_PTX, MMA_STEPS_PTX, WGMMA_EXCHANGE_128_PTX, WGMMA_EXCHANGE_PTX, WGMMA_SBO,
                     WGMMA_STEPS_PTX, k_warp_sum_rounds, m64_exchange_buffer, mma_b_factor, shared_b_bytes,
                     shared_buffer_ptx, staged_b_bytes, staged_b_chunk, staged_b_chunks, staged_b_offset)

# One program: 4 warps of ROW_GROUPS 16-row groups each, so 128 threads and 64 or 128 rows; with
# K_WARPS > 1 K_WARPS warps on 16 or 32 rows, or with shared B K_WARPS K slices of those 4 warps
# (written as literals in the kernel and its helpers: Helion passes module constants as extra
# arguments).


def eviction(role, EVICT):
    """The L2 eviction policy of the weights' ("w": evict_first, streamed once) and the activation's ("x": evict_last,
    read again by every program) loads with EVICT, else none."""
    return {"w": "evict_first", "x": "evict_last"}[role] if EVICT else None


# PTX type and constraint of a hinted load by the element type of the tensor it reads: 16-bit words zero-extended
# into 32-bit registers (the factor words, of which the decode reads the low two bytes)
HINTED_TYPES = {torch.int32: ("b32", "r", "tl.int32"), torch.int64: ("b64", "l", "tl.int64"),
                torch.int16: ("u16", "r", "tl.int32")}


def hinted_loads(ptr, index, role, EVICT, count=1, stride=1):
    """`count` loads of `ptr` at index, index + stride, ...: with EVICT 1 Triton's loads with the role's `eviction`
    policy, with EVICT 2 (`plans._mma_hoist`) inline PTX carrying that policy as an L2 cache hint. Triton writes the policy
    anew for every load (11 sm_90 instructions per K-loop iteration at M = 16); here it is one pure asm without loop
    inputs, which LLVM hoists out of the loop."""
    if EVICT != 2:
        return [hl.load(ptr, [index + stride * i], eviction_policy=eviction(role, EVICT)) for i in range(count)]
    kind, reg, out = HINTED_TYPES[ptr.dtype]
    size = ptr.element_size()
    policy = hl.inline_asm_elementwise(
        f"createpolicy.fractional.L2::{eviction(role, EVICT)}.b64 $0, 1.0;", "=l,r", [torch.zeros_like(index)],
        dtype=torch.int64, is_pure=True, pack=1)
    asm = " ".join(f"ld.global.L1::{eviction(role, EVICT)}.L2::cache_hint.{kind} ${i}, [${count}+{i * stride * size}], "
                   f"${count + 1};" for i in range(count))
    constraints = ",".join([f"={reg}"] * count + ["l", "l"])
    like = torch.zeros_like(index, dtype=torch.int64 if reg == "l" else torch.int32)
    loaded = hl.inline_triton(
        f"tl.inline_asm_elementwise('{asm}', '{constraints}', [{{0}} + {{1}}, {{2}}], "
        f"dtype=({out},) * {count}, is_pure=True, pack=1)",
        args=(ptr, index, policy), output_like=(like,) * count)
    return list(loaded)


def program_row_warps(K_WARPS, SHARED_B):
    """Warps of a program on different row groups: 4, or 1 when K_WARPS > 1 warps split K
    without shared B (with it, K_WARPS slices of 4 warps: the exchange takes 128 threads)."""
    return 4 if K_WARPS == 1 or SHARED_B else 1


def thread_ids(threads=128):
    """%tid.x of each thread, as a [threads] tensor holding one value per thread."""
    return hl.inline_asm_elementwise(
        "mov.u32 $0, %tid.x;", "=r,r", [hl.zeros([threads], dtype=torch.int32)], dtype=torch.int32, is_pure=True, pack=1
    )


def grid_wait(tid):
    """`tid` after `griddepcontrol.wait` (`decode.GRID_DEPENDENCY_WAIT_PTX`): the kernel makes every address from it, so
    it touches no memory before the wait; what it passes in (`prefetch_first_windows`' tokens) comes before."""
    return hl.inline_asm_elementwise(GRID_DEPENDENCY_WAIT_PTX, "=r,r", [tid], dtype=torch.int32, is_pure=False, pack=1)


def triton_asm(ptx, constraints, args, dtype):
    """`hl.inline_triton` source of a `tl.inline_asm_elementwise` of `ptx` (its braces escaped for the template) on
    `args` (template fields: "{0} + {1}", ...), not pure."""
    ptx = ptx.replace("{", "{{").replace("}", "}}")
    return f"tl.inline_asm_elementwise('{ptx}', '{constraints}', [{args}], dtype={dtype}, is_pure=False, pack=1)"


def prefetch_l2(ptr, index, like):
    """Ask L2 for the line of `ptr[index]` (`prefetch.global.L2`: nothing is returned, so it may run before
    `grid_wait`: the data is read after the wait, through L2, which every write reaches); returns a zero token to add
    into `grid_wait`'s input (Helion drops an asm whose output is unused)."""
    return hl.inline_triton(triton_asm("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", "{0} + {1}", "tl.int32"),
                            args=(ptr, index), output_like=like)


def part_windows(part, windows, steps, SPLIT, uneven):
    """(first window, windows) of split-K part `part` of SPLIT: `steps` each, or where SPLIT does not divide the K / 64
    windows (`uneven`) windows part W / SPLIT .. (part + 1) W / SPLIT, steps or steps + 1 of them."""
    if uneven:
        first = part * windows // SPLIT
        return first, (part + 1) * windows // SPLIT - first
    return part * steps, steps


def warp_start(tid, tile_p, part, windows, steps, uneven, SPLIT, K_WARPS, SHARED_B, ROW_GROUPS):
    """(the warp's first row group, its first window) in `mma_gemv_kernel`'s program (tile_p, part)."""
    if K_WARPS == 1:  # the program's row groups, and its first window
        return (tile_p * 4 + (tid >> 5)) * ROW_GROUPS, part_windows(part, windows, steps, SPLIT, uneven)[0]
    if SHARED_B:  # K slice tid >> 7 of 4 warps on the program's 4 row groups (pairs)
        return (tile_p * 4 + ((tid >> 5) & 3)) * ROW_GROUPS, (part * K_WARPS + (tid >> 7)) * steps
    # one row group (pair) per program; warp w from window w * steps, a per-thread value, so only here (for K_WARPS 1
    # too it cost nvfp4 x nvfp4 11 sm_90 instructions per window and bf16 x mxfp4 a second load round trip:
    # tests/test_bench.py)
    if windows % K_WARPS:  # (SPLIT 1) the first W mod K_WARPS warps take one window more (`tail_window`)
        warp = tid >> 5
        return tile_p * ROW_GROUPS, warp * steps + torch.clamp(warp, max=windows % K_WARPS)
    return tile_p * ROW_GROUPS, (part * K_WARPS + (tid >> 5)) * steps


def prefetch_first_windows(w, f, tid, tile_p, part, windows, steps, uneven, blocks, SPLIT, K_WARPS, SHARED_B,
                           ROW_GROUPS, PDL):
    """`tid` plus the zero tokens of the warp's first PDL - 1 windows of weight words and factors prefetched into L2
    (`prefetch_l2`, one line request per lane and row group window): given to `grid_wait`, their DRAM round trip
    overlaps the wait for the kernel before."""
    gr, first = warp_start(tid, tile_p, part, windows, steps, uneven, SPLIT, K_WARPS, SHARED_B, ROW_GROUPS)
    lane = tid & 31
    for j in range(PDL - 1):
        for r in range(ROW_GROUPS):
            window = (gr + r) * windows + (first + j) % windows
            tid = tid + prefetch_l2(w, window * 128 + 4 * lane, tid) + prefetch_l2(f, window * blocks * 8, tid)
    return tid


def launch_dependents(value, PDL):
    """`value` after `griddepcontrol.launch_dependents` (with PDL; `decode.LAUNCH_DEPENDENTS_PTX`): called on an
    accumulator after the K loop, it lets the next kernel of the stream launched with PDL start its CTAs as this one's
    finish, up to its own `griddepcontrol.wait`."""
    if not PDL:
        return value
    return hl.inline_asm_elementwise(LAUNCH_DEPENDENTS_PTX, "=r,r", [value], dtype=torch.float32, is_pure=False, pack=1)


def zero_sums(threads=128, count=4):
    """`count` fp32 accumulators per thread: 4 for one row group x column group."""
    return tuple(hl.zeros([threads], dtype=torch.float32) for _ in range(count))


def a_words(w, f, gr, win, lane, q, g, windows, blocks, EVICT):
    """Row group `gr`'s window `win`: the thread's 4 A words (one per mma step) and its rows'
    factor byte."""
    base = (gr * windows + win) * 128 + lane
    factors = hinted_loads(f, ((gr * windows + win) * blocks + ((q * blocks) >> 2)) * 8 + g, "w", EVICT)[0]
    return (*hinted_loads(w, base, "w", EVICT, 4, 32), factors.to(torch.int32))


def row_group_words(w, f, gr, win, lane, q, g, windows, blocks, ROW_GROUPS, EVICT):
    """`a_words` of the warp's row groups gr and gr + 1 (with one row group: gr's twice)."""
    a0 = a_words(w, f, gr, win, lane, q, g, windows, blocks, EVICT)
    return a0, a_words(w, f, gr + 1, win, lane, q, g, windows, blocks, EVICT) if ROW_GROUPS == 2 else a0


def a_fragments(loaded, W_ELEM, ENCODING):
    """The 16 bf16x2 A registers of a window from its `a_words` (int32 words of E2M1, int64 of
    E4M3)."""
    kind = "r" if W_ELEM == ELEMENT_CODES["e2m1"] else "l"
    return hl.inline_asm_elementwise(
        MMA_A_FRAGMENTS_PTX[W_ELEM, ENCODING], ",".join(["=r"] * 16 + [kind] * 4 + ["r"]), list(loaded),
        dtype=(torch.int32,) * 16, is_pure=True, pack=1,
    )


def wide_words(x64, index, count):
    """The `count` (2 or 4) int64 words at `index` .. (16 or 32 bytes, 16-byte aligned) in 16-byte loads (pure: Helion
    writes the asm once per output and LLVM merges them)."""
    like = torch.zeros_like(index, dtype=torch.int64)
    loads = " ".join(f"ld.global.v2.b64 {{{{${2 * i}, ${2 * i + 1}}}}}, [${count}+{16 * i}];" for i in range(count // 2))
    return list(hl.inline_triton(
        f"tl.inline_asm_elementwise('{loads}', '{','.join(['=l'] * count + ['l'])}', [({{0}} + {{1}}).to(tl.int64)], "
        f"dtype=(tl.int64,) * {count}, is_pure=True, pack=1)",
        args=(x64, index), output_like=(like,) * count))


def b_words(x64, xs, row, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, WIDE_B=0):
    """B of one column group's window, as loaded: activation row `row` at the lane's 16 K
    (int64 words of 4 bf16, 16 fp4 or 8 fp8 elements), then, for fp4 / fp8, its scale code. With WIDE_B the 32 bytes
    of bf16 or 16 of fp8 come in 16-byte loads (`wide_words`) instead of 8-byte ones."""
    per_word = 4 if ACT_ELEM == ELEMENT_CODES["bf16"] else 16 if ACT_ELEM == ELEMENT_CODES["e2m1"] else 8
    # constant divisions only: a tensor // costs sign fix-ups (6 more instructions per window)
    index = row * (K // per_word) + win * (64 // per_word) + q * (16 // per_word)
    if WIDE_B and ACT_ELEM != ELEMENT_CODES["e2m1"]:
        words = wide_words(x64, index, 16 // per_word)
    else:
        words = hinted_loads(x64, index, "x", EVICT, 16 // per_word)
    if ACT_ELEM == ELEMENT_CODES["bf16"]:
        return words
    block = win * (64 // BLOCK_A) + (q >> (BLOCK_A // 32))  # the lane's 16 K: block q (16) or q / 2 (32)
    return [*words, hl.load(xs, [scale_offset(SCALE_LAYOUTS[A_LAYOUT], row, block, K // BLOCK_A)])]


def b_registers(loaded, ACT_ELEM, ACT_SCALE):
    """The B operand of a window from its `b_words`: bf16 as loaded (4 int64), fp4 / fp8 decoded
    into 8 bf16x2 registers with the block's factor (`decode.MMA_B_FRAGMENTS_PTX`)."""
    if ACT_ELEM == ELEMENT_CODES["bf16"]:
        return loaded
    *words, code = loaded
    factor = mma_b_factor(code.to(torch.int32), ACT_SCALE)
    return hl.inline_asm_elementwise(
        MMA_B_FRAGMENTS_PTX[ACT_ELEM, ACT_SCALE, 16], ",".join(["=r"] * 8 + ["l"] * len(words) + ["r"]), [*words, factor],
        dtype=(torch.int32,) * 8, is_pure=True, pack=1,
    )


def own_b_words(x64, xs, row_0, row_1, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, COL_GROUPS):
    """`b_words` of a warp that loads its own B (no shared or staged B): column groups 0 and 1 (activation rows
    `row_0`, `row_1`), or column group 0's twice with one."""
    loads_b0 = b_words(x64, xs, row_0, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT)
    return loads_b0, b_words(x64, xs, row_1, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT) if COL_GROUPS == 2 else loads_b0


def own_b_registers(loads_b0, loads_b1, ACT_ELEM, ACT_SCALE, COL_GROUPS):
    """`b_registers` of `own_b_words`' two column groups (column group 0's twice with one)."""
    b_0 = b_registers(loads_b0, ACT_ELEM, ACT_SCALE)
    return b_0, b_registers(loads_b1, ACT_ELEM, ACT_SCALE) if COL_GROUPS == 2 else b_0


def shared_b_words(x64, xs, tid, win, K, M, ACT_ELEM, BLOCK_A, A_LAYOUT, COL_GROUPS, EVICT):
    """The thread's share of a window's B (`decode.MMA_SHARED_B_PTX`), as loaded: activation
    row (tid >> 3) mod 8 COL_GROUPS (past M: row M - 1) at K 8 (tid & 7) .. + 8 (bf16: two int64
    words; fp4: one int32 word; fp8: one int64), then, for fp4 / fp8, its scale code."""
    r = (tid >> 3) & (8 * COL_GROUPS - 1)
    row = torch.where(r < M, r, M - 1)
    j = tid & 7
    if ACT_ELEM == ELEMENT_CODES["bf16"]:
        return hinted_loads(x64, row * (K // 4) + win * 16 + 2 * j, "x", EVICT, 2)
    if ACT_ELEM == ELEMENT_CODES["e2m1"]:
        word = hinted_loads(x64, row * (K // 16) + win * 4 + (j >> 1), "x", EVICT)[0]
        words = [(word >> ((j & 1) * 32).to(torch.int64)).to(torch.int32)]
    else:
        words = hinted_loads(x64, row * (K // 8) + win * 8 + j, "x", EVICT)
    block = win * (64 // BLOCK_A) + (j >> (BLOCK_A // 16))  # 8 K per thread: block j / 2 (16) or j / 4 (32)
    return [*words, hl.load(xs, [scale_offset(SCALE_LAYOUTS[A_LAYOUT], row, block, K // BLOCK_A)])]


def window_parity(like, win):
    """Window `win`'s parity as an int32 tensor shaped as `like`: which of the two shared-memory
    buffers an exchange writes."""
    return torch.zeros_like(like, dtype=torch.int32) + (win & 1)


def shared_buffer(size, threads, align=16):
    """The shared address of a new `size`-byte buffer (`decode.shared_buffer_ptx`), one value per
    thread: made once, before the K loop."""
    return hl.inline_asm_elementwise(shared_buffer_ptx(size, align), "=r,r", [hl.zeros([threads], dtype=torch.int32)],
                                     dtype=torch.int32, is_pure=True, pack=1)


def shared_b_addresses(buffer, COL_GROUPS, K_WARPS, ROW_GROUPS):
    """The thread's exchange addresses in `buffer` and its barrier (`decode.MMA_SHARED_B_ADDRESSES_PTX`), made once,
    before the K loop; with two row groups per warp only the buffer (the exchange makes the rest every window:
    registers)."""
    if ROW_GROUPS == 2:
        return (buffer,)
    return hl.inline_asm_elementwise(MMA_SHARED_B_ADDRESSES_PTX[COL_GROUPS, K_WARPS], "=r,=r,=r,r", [buffer],
                                     dtype=(torch.int32,) * 3, is_pure=True, pack=1)


def shared_b_registers(loaded, win, addresses, ACT_ELEM, ACT_SCALE, COL_GROUPS, K_WARPS, ROW_GROUPS):
    """Every column group's B registers (8 each) of a window from the threads' `shared_b_words`:
    fp4 / fp8 decoded (8 elements per thread), exchanged through shared memory (by each of the
    K_WARPS K slices of 128 threads) at the thread's `shared_b_addresses`."""
    if ACT_ELEM == ELEMENT_CODES["bf16"]:
        chunk = loaded
    else:
        *words, code = loaded
        factor = mma_b_factor(code.to(torch.int32), ACT_SCALE)
        kind = "r" if ACT_ELEM == ELEMENT_CODES["e2m1"] else "l"
        chunk = hl.inline_asm_elementwise(
            MMA_B_FRAGMENTS_PTX[ACT_ELEM, ACT_SCALE, 8], ",".join(["=r"] * 4 + [kind, "r"]), [*words, factor],
            dtype=(torch.int32,) * 4, is_pure=True, pack=1,
        )
    wide = ACT_ELEM == ELEMENT_CODES["bf16"]
    parity = window_parity(chunk[0], win)
    # pure although it stores and waits: Helion writes one asm call per output, and LLVM
    # merges them into one only when they are pure (not pure: 16 copies, each storing and
    # waiting; when each also declared its buffer, 72 KB, which ptxas refused). Every thread
    # runs it once per window, unconditionally, and its inputs differ per window, so it is
    # neither hoisted nor merged across windows.
    regs = hl.inline_asm_elementwise(
        MMA_SHARED_B_PTX[COL_GROUPS, wide, K_WARPS, ROW_GROUPS == 1],
        ",".join(["=r"] * (8 * COL_GROUPS) + ["l" if wide else "r"] * len(chunk) + ["r"] * (1 + len(addresses))),
        [*chunk, parity, *addresses],
        dtype=(torch.int32,) * (8 * COL_GROUPS), is_pure=True, pack=1,
    )
    return regs[:8], regs[8:] if COL_GROUPS == 2 else regs[:8]


def staged_b(x64, xs, lane, first, steps, threads, M, K, ACT_ELEM, ACT_SCALE, BLOCK_A, A_LAYOUT, early, EVICT):
    """Stage the warp's B (`decode.MMA_STAGED_B_STORE_PTX`): rows 0 .. M - 1 of the activation in
    the warp's K range (`steps` windows from `first`), decoded by 16-K chunks (`b_words`,
    `b_registers`, `decode.staged_b_chunk`) into a new shared buffer; returns the buffer's address,
    which the window reads (`staged_b_registers`) take so that they come after. The store waits for
    (and ignores) `early`, the first window's `a_words`, loaded before the staging."""
    buffer = shared_buffer(staged_b_bytes(M, K), threads)
    regs, offsets = [], []
    for j in range(staged_b_chunks(M, steps)):
        row, k16 = staged_b_chunk(lane, j, first, steps, M)
        regs += list(b_registers(b_words(x64, xs, row, k16 >> 2, k16 & 3, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT), ACT_ELEM,
                                 ACT_SCALE))
        offsets.append(staged_b_offset(row, k16, K))
    n = len(offsets)
    early = [word.to(torch.int32) for word in early]  # fp8 weights: the low half of each int64 word
    return hl.inline_asm_elementwise(MMA_STAGED_B_STORE_PTX[n],
                                     ",".join(["=r"] + ["r"] * (9 * n + 1 + len(early))),
                                     [*regs, *offsets, buffer, *early], dtype=torch.int32, is_pure=False, pack=1)


def staged_b_registers(staged, row, win, q, K):
    """The 8 B registers of the lane's column (activation `row`) in window `win` from a staged
    buffer (`staged_b`): its 16-K chunk 4 win + q."""
    return hl.inline_asm_elementwise(MMA_STAGED_B_LOAD_PTX, ",".join(["=r"] * 8 + ["r"]),
                                     [staged + staged_b_offset(row, 4 * win + q, K)],
                                     dtype=(torch.int32,) * 8, is_pure=True, pack=1)


def mma_window(frags, b, acc):
    """acc (4 fp32 per thread) += the window's 4 mma steps with B `b` (4 int64 bf16 words or
    8 decoded int32 registers)."""
    kind = "l" if len(b) == 4 else "r"
    return hl.inline_asm_elementwise(
        MMA_STEPS_PTX[len(b)], ",".join(["=r"] * 4 + ["r"] * 16 + [kind] * len(b) + ["r"] * 4), [*frags, *b, *acc],
        dtype=(torch.float32,) * 4, is_pure=True, pack=1,
    )


def out_index(col_group, q, g, gr, i, M, N, col0=0):
    """(flat index into [M, N], valid) of accumulator i of a thread: c0/c1 are row R0 =
    16 gr + g at columns 2q, 2q+1 of the column group (from activation row `col0`), c2/c3 row
    R0 + 8. Invalid (col >= M) indices point at column 0; every store and add is masked by `valid`."""
    col = col0 + 8 * col_group + 2 * q + (i & 1)
    valid = col < M
    return torch.where(valid, col, 0) * N + gr * 16 + g + 8 * (i >> 1), valid


def store_out(out, bias, index, valid, total, N, HAS_BIAS):
    if HAS_BIAS:
        total = total + hl.load(bias, [index % N]).to(torch.float32)
    hl.store(out, [index], total.to(out.dtype), extra_mask=valid)


def output_slots(M, ROW_GROUPS, COL_GROUPS):
    """(row group offset r, column group c, accumulator i) of each accumulator that is an
    output in some lane: column 8c + 2q + (i & 1) < M (at M = 1 the odd ones never are, so
    their adds, reads and stores are not compiled at all). Its sum is sums[r][c][i]."""
    return [(r, c, i) for r in range(ROW_GROUPS) for c in range(COL_GROUPS) for i in range(4) if 8 * c + (i & 1) < M]


def store_groups(out, bias, sums, gr, q, g, scale, M, N, HAS_BIAS, ROW_GROUPS, COL_GROUPS, owner=None, col0=0):
    """SPLIT == 1: the accumulators into `out` (only threads where `owner` is true, if given)."""
    for r, c, i in output_slots(M, ROW_GROUPS, COL_GROUPS):
        index, valid = out_index(c, q, g, gr + r, i, M, N, col0)
        store_out(out, bias, index, valid if owner is None else valid & owner, sums[r][c][i] * scale, N, HAS_BIAS)


def k_warp_sums(sums, M, K, ROW_GROUPS, COL_GROUPS, SHARED_B, K_WARPS, STAGE_B):
    """`sums` with every output slot summed over the program's K_WARPS warps (K slices of 4 warps
    with shared B), in the first (`decode.MMA_K_WARP_SUM_PTX`; the other slots are never stored)."""
    slots = output_slots(M, ROW_GROUPS, COL_GROUPS)
    n = len(slots)
    group = 32 * program_row_warps(K_WARPS, SHARED_B)
    other = shared_b_bytes(COL_GROUPS, K_WARPS) if SHARED_B else staged_b_bytes(M, K) if STAGE_B else 0
    rounds = k_warp_sum_rounds(n, K_WARPS, group, other)
    # pure although it stores and waits, as `shared_b_registers`: one call per output, merged
    totals = hl.inline_asm_elementwise(
        MMA_K_WARP_SUM_PTX[n, K_WARPS, group, rounds], ",".join(["=r"] * n + ["r"] * n), [sums[r][c][i] for r, c, i in slots],
        dtype=(torch.float32,) * n, is_pure=True, pack=1,
    )
    summed = [[list(col) for col in row] for row in sums]
    for (r, c, i), total in zip(slots, totals, strict=True):  # n >= 2: a tuple
        summed[r][c][i] = total
    return summed


def add_groups(workspace, sums, gr, q, g, M, N, ROW_GROUPS, COL_GROUPS, col0=0, keep=None):
    """SPLIT > 1: add the partial sums into the workspace (relaxed adds, masked: at M = 1
    only lanes q = 0 hold outputs, and unmasked adds of zeros for the rest all hit column 0; none where `keep`,
    if given, is false)."""
    for r, c, i in output_slots(M, ROW_GROUPS, COL_GROUPS):
        index, valid = out_index(c, q, g, gr + r, i, M, N, col0)
        valid = valid if keep is None else valid & keep
        hl.inline_triton("tl.atomic_add({0} + {1}, {2}, mask={3}, sem='relaxed')",
                         args=(workspace, index, sums[r][c][i], valid), output_like=None)


def store_sums(out, bias, workspace, gr, q, g, scale, M, N, HAS_BIAS, ROW_GROUPS, COL_GROUPS, col0=0):
    """The last program of a row of programs: the workspace sums into `out`, zeros back."""
    zeros = torch.zeros_like(q, dtype=torch.float32)
    slots = [out_index(c, q, g, gr + r, i, M, N, col0) for r, c, i in output_slots(M, ROW_GROUPS, COL_GROUPS)]
    # Every read first: read, store, read ... made ptxas wait for each read's L2 round trip
    # before issuing the next (sm_90 SASS: 8 serial ATOMG at M = 16, 16 with two row groups).
    totals = [hl.atomic_add(workspace, [index], zeros) for index, _ in slots]  # at L2, after the ticket's acquire
    for (index, valid), total in zip(slots, totals, strict=True):
        store_out(out, bias, index, valid, total * scale, N, HAS_BIAS)
        hl.store(workspace, [index], zeros, extra_mask=valid)


def fragment_index(tile, tid, c, groups):
    """Where thread `tid`'s 4 sums of column group c of output tile `tile` sit in a workspace in fragment order
    (`add_fragments`): 16 contiguous bytes, a warp's 512, a column group's 4 KB."""
    return ((tile * groups + c) * 256 + tid) * 4


def fragment_workspace_sums(tiles, groups):
    """The fp32 sums a workspace in fragment order holds for `tiles` output tiles of `groups` column groups: where
    `fragment_index` would place tile `tiles`."""
    return fragment_index(tiles, 0, 0, groups)


def add_fragments(workspace, sums, tile, tid, groups, keep):
    """mma_m64_kernel's SPLIT > 1 without clusters: the thread's sums (`m64_sums`) added into the workspace in fragment
    order, one `red.global.add.v4.f32` per column group (`decode.FRAGMENT_ADD_PTX`; none where `keep` is false: the
    CTA sums in its cluster) instead of `add_groups`' four scalar adds at the outputs' positions. H100, M = 64, N = 8192
    (split 4): the epilogue alone 13.2 -> 8.2 us (`python -m bench.split_sums`), the kernel 2.3-5.3 us faster
    (`plans.MMA_M64_FRAGMENT_SUMS`)."""
    keep = torch.zeros_like(tid) + keep.to(torch.int32)
    for c in range(groups):
        # the address as an integer: tl.inline_asm_elementwise does not take a pointer beside floats
        asm = triton_asm(FRAGMENT_ADD_PTX, "=r,l,f,f,f,f,r", "({0} + {1}).to(tl.int64), {2}, {3}, {4}, {5}, {6}", "tl.int32")
        hl.inline_triton(asm, args=(workspace, fragment_index(tile, tid, c, groups), *sums[0][c], keep), output_like=None)


def store_fragments(out, bias, workspace, tile, tid, q, g, gr, scale, M, N, HAS_BIAS, groups, col0=0):
    """The last part of an output tile (`add_fragments`): every column group's totals read at L2 first, then stored into
    `out` and zeros written back."""
    totals = [hl.inline_triton(triton_asm(FRAGMENT_LOAD_PTX, "=f,=f,=f,=f,l", "{0} + {1}", "(tl.float32,) * 4"),
                               args=(workspace, fragment_index(tile, tid, c, groups)),
                               output_like=(torch.zeros_like(tid, dtype=torch.float32),) * 4) for c in range(groups)]
    for c in range(groups):
        for i in range(4):
            index, valid = out_index(c, q, g, gr, i, M, N, col0)
            store_out(out, bias, index, valid, totals[c][i] * scale, N, HAS_BIAS)
        hl.inline_triton(triton_asm(FRAGMENT_ZERO_PTX, "=r,l", "{0} + {1}", "tl.int32"),
                         args=(workspace, fragment_index(tile, tid, c, groups)), output_like=None)


@helion.kernel(**KERNEL_SETTINGS)
def mma_gemv_kernel(
    x64: torch.Tensor,
    xs: torch.Tensor,
    x_post: torch.Tensor,
    w: torch.Tensor,
    f: torch.Tensor,
    post: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor,
    tickets: torch.Tensor,
    M: hl.constexpr,
    N: hl.constexpr,
    K: hl.constexpr,
    BLOCK: hl.constexpr,
    W_ELEM: hl.constexpr,
    ENCODING: hl.constexpr,
    ACT_ELEM: hl.constexpr,
    ACT_SCALE: hl.constexpr,
    BLOCK_A: hl.constexpr,
    A_LAYOUT: hl.constexpr,
    HAS_BIAS: hl.constexpr,
    PRELOAD: hl.constexpr,
    EVICT: hl.constexpr,
    PDL: hl.constexpr,
    COL_GROUPS: hl.constexpr,
    CLUSTER: hl.constexpr,
    ROW_GROUPS: hl.constexpr,
    SPLIT: hl.constexpr,
    SHARED_B: hl.constexpr,
    AHEAD: hl.constexpr,
    K_WARPS: hl.constexpr,
    STAGE_B: hl.constexpr,
) -> torch.Tensor:
    """out (flat [M * N]) = post * x_post * (x @ W^T) (+ bias); x64: the activation [M, K] as
    int64 words, flat (ELEMENT_CODES value ACT_ELEM: bf16, or fp4 / fp8 with scale codes xs
    of SCALE_CODES value ACT_SCALE, blocks of BLOCK_A, flat in SCALE_LAYOUTS[A_LAYOUT]); w, f:
    the weights' words (ELEMENT_CODES value W_ELEM: int32 of 8 fp4 or int64 of 8 fp8 codes) and
    factor words ("mma_m16k16"), flat. SPLIT > 1: workspace (float32 [M * N]) and tickets (int32,
    one per program row) are zero before and after. K_WARPS > 1 (SPLIT 1): a program is
    K_WARPS warps on the same 16 ROW_GROUPS rows (with SHARED_B K_WARPS slices of the 4 warps on
    64 ROW_GROUPS rows), each over its own K_WARPS-th of K, summed through shared memory at the
    end (`k_warp_sums`). STAGE_B (K_WARPS > 1, COL_GROUPS 1, fp4 / fp8 activations): each warp
    decodes its K range of the activation into shared memory once (`staged_b`) and reads its B
    registers there every window. PRELOAD (neither): the warp's windows are straight-line code, every word loaded
    before the first mma (`preloaded_windows`). CLUSTER (SPLIT > 1): the SPLIT parts of a row of programs are consecutive
    programs, and launched as one thread-block cluster (`launch.DirectLaunch`) they sum through distributed shared
    memory (`gemv_cluster_store`) instead of the workspace, which they take when launched without clusters."""
    row_warps = program_row_warps(K_WARPS, SHARED_B)
    threads = 32 * row_warps * K_WARPS
    windows = K // 64
    steps = windows // (SPLIT * K_WARPS)
    # SPLIT that does not divide the windows (K_WARPS 1): part p runs windows p W / SPLIT .. (p + 1) W / SPLIT,
    # a loop of steps or steps + 1 (config "split" only: the wave rule takes powers of two)
    uneven = K_WARPS == 1 and windows % SPLIT != 0
    # K_WARPS that does not divide the windows (no shared or staged B): every warp loops `steps` windows, then the
    # first W mod K_WARPS warps one more (`tail_window`; config "k_warps" only)
    tail = K_WARPS > 1 and windows % K_WARPS != 0
    blocks = 64 // BLOCK  # scale blocks per window: lane q reads block q * blocks // 4
    rows = N // (16 * row_warps * ROW_GROUPS)
    for program in hl.tile(rows * SPLIT, block_size=1):
        # the row programs first, or with CLUSTER the K parts (a cluster's CTAs are consecutive programs)
        pid = program.begin
        tile_p = pid // SPLIT if CLUSTER else pid % rows
        part = pid % SPLIT if CLUSTER else pid // rows
        tid = thread_ids(threads)
        if PDL > 1:
            tid = prefetch_first_windows(w, f, tid, tile_p, part, windows, steps, uneven, blocks, SPLIT, K_WARPS,
                                         SHARED_B, ROW_GROUPS, PDL)
        if PDL:
            tid = grid_wait(tid)
        lane = tid & 31
        g = lane >> 2
        q = lane & 3
        gr, first = warp_start(tid, tile_p, part, windows, steps, uneven, SPLIT, K_WARPS, SHARED_B, ROW_GROUPS)
        # B column g of column group c is activation row 8c + g (the last row past M)
        row_0 = torch.where(g < M, g, M - 1)
        row_1 = torch.where(g + 8 < M, g + 8, M - 1)
        # accumulators (Helion carries tensors, not tuples, through loops): a row group 0 x
        # column group 0, b 0 x 1, c 1 x 0, d 1 x 1
        a0, a1, a2, a3 = zero_sums(threads)
        b0, b1, b2, b3 = zero_sums(threads)
        c0, c1, c2, c3 = zero_sums(threads)
        d0, d1, d2, d3 = zero_sums(threads)
        ctas = cluster_arrive(hl.zeros([], dtype=torch.int32), CLUSTER)
        if SHARED_B:
            b_addresses = shared_b_addresses(shared_buffer(shared_b_bytes(COL_GROUPS, K_WARPS), threads), COL_GROUPS,
                                             K_WARPS, ROW_GROUPS)
        if STAGE_B:  # the first window's weights requested before the staging, so that its L2 round trip and
            # decode overlap their DRAM one (H100, M = 1, 8192^2, nvfp4 x nvfp4 16.3 -> 16.0 us,
            # bench/results/h100_mma_ksum_early_m1_n8192_k8192_0b62f40_2026-11-25.log, configs B / C)
            staged = staged_b(x64, xs, lane, first, steps, threads, M, K, ACT_ELEM, ACT_SCALE, BLOCK_A, A_LAYOUT,
                              row_group_words(w, f, gr, first, lane, q, g, windows, blocks, 1, EVICT)[0], EVICT)
        if AHEAD:  # window w + 1's words loaded before window w's barrier (the shared B exchange's)
            e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14 = shared_window_words(
                x64, xs, w, f, tid, gr, first, lane, q, g, windows, blocks, K, M, ACT_ELEM, BLOCK_A, A_LAYOUT, COL_GROUPS,
                ROW_GROUPS, EVICT)
        if PRELOAD:  # the warp's few windows, every word loaded before the first window's mma
            a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3 = preloaded_windows(
                (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3), x64, xs, w, f, first, steps, lane, q,
                g, gr, row_0, row_1, windows, blocks, K, W_ELEM, ENCODING, ACT_ELEM, ACT_SCALE, BLOCK_A, A_LAYOUT, EVICT,
                COL_GROUPS, ROW_GROUPS)
        for it in hl.tile(0 if PRELOAD else part_windows(part, windows, steps, SPLIT, uneven)[1], block_size=1):
            win = first + it.begin
            # every load of the window before any use: a load that comes after an mma waits for
            # the loads that mma used (`bench.sass` rt, sm_90, M = 1, two row groups: nvfp4 4 -> 1
            # round trips per window, mxfp8 x mxfp4 3 -> 1; ptxas still sinks bf16's second group)
            if AHEAD:  # this window's words came one window earlier
                loaded = (e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14)
                e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14 = shared_window_words(
                    x64, xs, w, f, tid, gr, first + (it.begin + 1) % steps, lane, q, g, windows, blocks, K, M, ACT_ELEM,
                    BLOCK_A, A_LAYOUT, COL_GROUPS, ROW_GROUPS, EVICT)
            elif SHARED_B:
                loaded = shared_window_words(x64, xs, w, f, tid, gr, win, lane, q, g, windows, blocks, K, M, ACT_ELEM,
                                             BLOCK_A, A_LAYOUT, COL_GROUPS, ROW_GROUPS, EVICT)
            if SHARED_B:
                loads_b, loads_a0, loads_a1 = shared_window_parts(loaded)
            else:
                if not STAGE_B:
                    loads_b0, loads_b1 = own_b_words(x64, xs, row_0, row_1, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT,
                                                     EVICT, COL_GROUPS)
                loads_a0, loads_a1 = row_group_words(w, f, gr, win, lane, q, g, windows, blocks, ROW_GROUPS, EVICT)
            if SHARED_B:
                b_0, b_1 = shared_b_registers(loads_b, win, b_addresses, ACT_ELEM, ACT_SCALE, COL_GROUPS, K_WARPS,
                                              ROW_GROUPS)
            elif STAGE_B:  # one column group
                b_0 = staged_b_registers(staged, row_0, win, q, K)
                b_1 = b_0
            else:
                b_0, b_1 = own_b_registers(loads_b0, loads_b1, ACT_ELEM, ACT_SCALE, COL_GROUPS)
            a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3 = group_mmas(
                (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3), loads_a0, loads_a1, b_0, b_1, W_ELEM,
                ENCODING, COL_GROUPS, ROW_GROUPS)
        if tail:
            a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3 = tail_window(
                (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3), x64, xs, w, f, tid, gr, first + steps,
                lane, q, g, row_0, row_1, windows, blocks, K, W_ELEM, ENCODING, ACT_ELEM, ACT_SCALE, BLOCK_A, A_LAYOUT,
                EVICT, COL_GROUPS, ROW_GROUPS, K_WARPS)
        a0 = launch_dependents(a0, PDL)
        scale = post[0] * x_post[0]
        sums = (((a0, a1, a2, a3), (b0, b1, b2, b3)), ((c0, c1, c2, c3), (d0, d1, d2, d3)))  # by row group, column group
        if K_WARPS > 1:
            summed = k_warp_sums(sums, M, K, ROW_GROUPS, COL_GROUPS, SHARED_B, K_WARPS, STAGE_B)
            store_groups(out, bias, summed, gr, q, g, scale, M, N, HAS_BIAS, ROW_GROUPS, COL_GROUPS, tid < 32 * row_warps)
        elif SPLIT == 1:
            store_groups(out, bias, sums, gr, q, g, scale, M, N, HAS_BIAS, ROW_GROUPS, COL_GROUPS)
        else:  # (data-dependent ifs on `ctas`, which is 1 without CLUSTER, as in mma_m64_kernel)
            if ctas == SPLIT:  # launched in clusters of the SPLIT parts
                gemv_cluster_store(out, bias, (a0, a1, a2, a3, b0, b1, b2, b3, c0, c1, c2, c3, d0, d1, d2, d3), q, g, gr,
                                   scale, M, N, HAS_BIAS, ROW_GROUPS, COL_GROUPS, SPLIT, CLUSTER)
            add_groups(workspace, sums, gr, q, g, M, N, ROW_GROUPS, COL_GROUPS, keep=workspace_keep(ctas, SPLIT, CLUSTER))
            if ctas != SPLIT:
                cluster_wait(q, CLUSTER)
                hl.inline_triton("tl.debug_barrier()", args=(), output_like=None)  # as split_k.add_part
                ticket = hl.atomic_add(tickets, [tile_p], 1, sem="acq_rel")
                if ticket == SPLIT - 1:
                    store_sums(out, bias, workspace, gr, q, g, scale, M, N, HAS_BIAS, ROW_GROUPS, COL_GROUPS)
                    hl.store(tickets, [tile_p], 0)
    return out


def tail_window(sums, x64, xs, w, f, tid, gr, win, lane, q, g, row_0, row_1, windows, blocks, K, W_ELEM, ENCODING,
                ACT_ELEM, ACT_SCALE, BLOCK_A, A_LAYOUT, EVICT, COL_GROUPS, ROW_GROUPS, K_WARPS):
    """`sums` (a, b, c, d: row group x column group, 4 each) plus window `win`, the window after the warp's loop, for
    the first W mod K_WARPS warps of `mma_gemv_kernel`'s program (W = K / 64 windows): the others run it on a window
    in bounds with B zeroed, which adds exact zeros (the weights decode finite: a NaN code or scale is in its own
    warp's sum too). Once a program, after the loop: no per-window cost."""
    valid = (tid >> 5) < windows % K_WARPS
    win = torch.clamp(win, max=windows - 1)
    loads_b0, loads_b1 = own_b_words(x64, xs, row_0, row_1, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, COL_GROUPS)
    loads_a0, loads_a1 = row_group_words(w, f, gr, win, lane, q, g, windows, blocks, ROW_GROUPS, EVICT)
    b_0 = [torch.where(valid, r, torch.zeros_like(r)) for r in b_registers(loads_b0, ACT_ELEM, ACT_SCALE)]
    b_1 = ([torch.where(valid, r, torch.zeros_like(r)) for r in b_registers(loads_b1, ACT_ELEM, ACT_SCALE)]
           if COL_GROUPS == 2 else b_0)
    return group_mmas(sums, loads_a0, loads_a1, b_0, b_1, W_ELEM, ENCODING, COL_GROUPS, ROW_GROUPS)


def preloaded_windows(sums, x64, xs, w, f, first, steps, lane, q, g, gr, row_0, row_1, windows, blocks, K, W_ELEM,
                      ENCODING, ACT_ELEM, ACT_SCALE, BLOCK_A, A_LAYOUT, EVICT, COL_GROUPS, ROW_GROUPS):
    """`sums` plus the warp's `steps` windows from `first` (PRELOAD), straight-line code: every window's A and B words
    are loaded before the first window's mma, so the warp waits for one memory round trip instead of one a window
    (the K loop's loads of window w + 1 wait behind window w's mma: `bench.sass` rt)."""
    loaded = []
    for i in range(steps):
        win = first + i
        loaded.append((*own_b_words(x64, xs, row_0, row_1, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, COL_GROUPS),
                       *row_group_words(w, f, gr, win, lane, q, g, windows, blocks, ROW_GROUPS, EVICT)))
    # a fence after the loads, on the first accumulator (an asm whose output goes unused is dropped): ptxas moves no
    # load past it, where it otherwise sinks each window's loads to just before that window's mma (13 round trips at
    # 4096 x 14336 over 32 parts; a bar.warp.sync there is optimized away)
    sums = (hl.inline_asm_elementwise("mov.b32 $0, $1; fence.acq_rel.cta;", "=r,r", [sums[0]], dtype=torch.float32,
                                      is_pure=False, pack=1), *sums[1:])
    for loads_b0, loads_b1, a_0, a_1 in loaded:
        b_0, b_1 = own_b_registers(loads_b0, loads_b1, ACT_ELEM, ACT_SCALE, COL_GROUPS)
        sums = group_mmas(sums, a_0, a_1, b_0, b_1, W_ELEM, ENCODING, COL_GROUPS, ROW_GROUPS)
    return sums


def group_mmas(sums, loads_a0, loads_a1, b_0, b_1, W_ELEM, ENCODING, COL_GROUPS, ROW_GROUPS):
    """`sums` (a, b, c, d: row group x column group, 4 accumulators each) plus one window: row group 0's A (decoded
    from `loads_a0`) and, with ROW_GROUPS 2, row group 1's (`loads_a1`), times column group 0's B `b_0` and, with
    COL_GROUPS 2, column group 1's `b_1`."""
    a, b, c, d = sums[0:4], sums[4:8], sums[8:12], sums[12:16]
    frags = a_fragments(loads_a0, W_ELEM, ENCODING)
    a = mma_window(frags, b_0, a)
    if COL_GROUPS == 2:
        b = mma_window(frags, b_1, b)
    if ROW_GROUPS == 2:
        frags = a_fragments(loads_a1, W_ELEM, ENCODING)
        c = mma_window(frags, b_0, c)
        if COL_GROUPS == 2:
            d = mma_window(frags, b_1, d)
    return (*a, *b, *c, *d)


def pad_slots(loaded, n=5):
    """Loaded words as n tensors (Helion carries tensors, not lists, through loops), padded
    with the first."""
    return tuple(loaded) + (loaded[0],) * (n - len(loaded))


def unpad_slots(padded, count):
    """The first `count` of `pad_slots`: the loaded words again."""
    return list(padded[:count])


def b_word_count(ACT_ELEM):
    """Tensors `b_words` returns: 4 bf16 words, or 1 fp4 / 2 fp8 words and the scale code."""
    return 4 if ACT_ELEM == ELEMENT_CODES["bf16"] else 2 if ACT_ELEM == ELEMENT_CODES["e2m1"] else 3


def ahead_window(first, i, steps, windows, uneven):
    """The window `mma_m64_kernel` loads i windows into a K part that starts at `first`; past the part's end in bounds
    and unused: wrapped into its `steps` windows, or with an uneven split (parts of steps or steps + 1) the last
    window of K at most (one scalar minimum per load instead of a remainder by a value known only at run time)."""
    if uneven:  # (a tensor: Python's min of two symbolic ints is decided when Helion traces the kernel)
        return torch.clamp(hl.zeros([], dtype=torch.int32) + (first + i), max=windows - 1)
    return first + i % steps


def window_words(x64, xs, w, f, row, gr, win, lane, q, g, windows, blocks, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT,
                 WIDE_B=0):
    """Window `win`'s words of a thread of `mma_m64_kernel` as 10 tensors: its B share (`b_words`, padded by `pad_slots`)
    and its A words (`a_words`)."""
    return (*pad_slots(b_words(x64, xs, row, win, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, WIDE_B)),
            *a_words(w, f, gr, win, lane, q, g, windows, blocks, EVICT))


def shared_window_words(x64, xs, w, f, tid, gr, win, lane, q, g, windows, blocks, K, M, ACT_ELEM, BLOCK_A, A_LAYOUT,
                        COL_GROUPS, ROW_GROUPS, EVICT):
    """Window `win`'s words of a thread of `mma_gemv_kernel` with shared B as 15 tensors: its B
    share (`shared_b_words`: 2 tensors, padded by `pad_slots`) and its two row groups' A words (the
    first twice with one row group)."""
    b = pad_slots(shared_b_words(x64, xs, tid, win, K, M, ACT_ELEM, BLOCK_A, A_LAYOUT, COL_GROUPS, EVICT))
    a0, a1 = row_group_words(w, f, gr, win, lane, q, g, windows, blocks, ROW_GROUPS, EVICT)
    return (*b, *a0, *a1)


def shared_window_parts(loaded):
    """`shared_window_words` back as (B share, row group words, row group words)."""
    return unpad_slots(loaded[:5], 2), list(loaded[5:10]), list(loaded[10:])


def m64_exchange(b, win, buffer, ACT_ELEM, WGMMA):
    """The window's B (the thread's share as `b_registers`) into shared memory: for mma.sync
    the address of the lane's column-group-0 registers (`decode.MMA_M64_EXCHANGE_PTX`), for
    wgmma the window's matrix descriptor (`decode.WGMMA_EXCHANGE_PTX`), in `buffer` (`shared_buffer`).
    Not pure: it stores and waits at a barrier, and has one output, so Helion writes it once."""
    wide = ACT_ELEM == ELEMENT_CODES["bf16"]
    return hl.inline_asm_elementwise(
        (WGMMA_EXCHANGE_PTX if WGMMA else MMA_M64_EXCHANGE_PTX)[wide],
        ",".join(["=l" if WGMMA else "=r"] + ["l" if wide else "r"] * len(b) + ["r", "r"]),
        [*b, window_parity(b[0], win), buffer],
        dtype=torch.int64 if WGMMA else torch.int32, is_pure=False, pack=1,
    )


def wgmma_exchange_128(shares, win, buffer, ACT_ELEM):
    """`m64_exchange` (wgmma) of a window of 128 activation rows: the thread's shares (`b_registers` each) of row
    r = t >> 2 and, with 256 threads, of row r + 64 (with 512 threads r covers all 128); returns the descriptor of
    rows 0 .. 63 (`decode.WGMMA_EXCHANGE_128_PTX`)."""
    wide = ACT_ELEM == ELEMENT_CODES["bf16"]
    b = [v for share in shares for v in share]
    return hl.inline_asm_elementwise(
        WGMMA_EXCHANGE_128_PTX[wide, len(shares)], ",".join(["=l"] + ["l" if wide else "r"] * len(b) + ["r", "r"]),
        [*b, window_parity(b[0], win), buffer], dtype=torch.int64, is_pure=False, pack=1,
    )


def m64_sums(first, second, TILE_M):
    """`mma_m64_kernel`'s accumulators (each 8 column groups of 4) as the output helpers take them, by row group and
    column group: with TILE_M 128 the second 64 activation rows are column groups 8 .. 15, one call of each helper
    (`store_sums` then reads all 64 totals in one batch)."""
    return (first + second,) if TILE_M == 128 else (first,)


def second_64_rows(descriptor):
    """The wgmma descriptor of rows 64 .. 127 of a 128-row window (`wgmma_exchange_128`): 8 core-matrix rows
    further."""
    return descriptor + (8 * WGMMA_SBO >> 4)


def wgmma_window(frags, descriptor, acc, COL_GROUPS):
    """acc (32 fp32 per thread: 8 column groups x 4) += the window's 4 wgmma steps over the
    first COL_GROUPS column groups (`decode.WGMMA_STEPS_PTX`); the others pass through."""
    n = 4 * COL_GROUPS
    sums = hl.inline_asm_elementwise(
        WGMMA_STEPS_PTX[COL_GROUPS], ",".join(["=r"] * n + ["r"] * 16 + ["l"] + ["r"] * n), [*frags, descriptor, *acc[:n]],
        dtype=(torch.float32,) * n, is_pure=True, pack=1,
    )
    return (*sums, *acc[n:])


def mma_window_m64(frags, address, col_group, acc):
    """acc += the window's 4 mma steps with column group `col_group`'s B read from the
    exchanged window at `address` (pure, as `mma_window`: it depends on the window's address)."""
    return hl.inline_asm_elementwise(
        MMA_STEPS_M64_PTX[col_group], ",".join(["=r"] * 4 + ["r"] * 21), [*frags, address, *acc],
        dtype=(torch.float32,) * 4, is_pure=True, pack=1,
    )


def cluster_arrive(like, CLUSTER):
    """With CLUSTER: every thread arrives at the cluster barrier (`decode.CLUSTER_ARRIVE_PTX`); returns the CTAs
    in the program's cluster as a scalar like `like` (1 without clusters, and always without CLUSTER)."""
    if not CLUSTER:
        return torch.ones_like(like, dtype=torch.int32)
    return hl.inline_asm_elementwise(CLUSTER_ARRIVE_PTX, "=r,r", [like], dtype=torch.int32, is_pure=False, pack=1)


def cluster_wait(like, CLUSTER):
    """With CLUSTER: wait for the cluster's arrivals of `cluster_arrive` (before the epilogue that does not sum in
    the cluster)."""
    if CLUSTER:
        hl.inline_asm_elementwise(CLUSTER_WAIT_PTX, "=r,r", [like], dtype=torch.int32, is_pure=False, pack=1)


def workspace_keep(ctas, SPLIT, CLUSTER):
    """Where the workspace adds run: without CLUSTER everywhere (None), with it where the program was launched
    without clusters."""
    return ctas != SPLIT if CLUSTER else None


def cluster_totals(values, q, SPLIT, threads):
    """`values` (fp32, one list per thread, the same output positions in every CTA of the cluster) summed over the
    cluster's SPLIT CTAs (`decode.MMA_CLUSTER_SUM_PTX`): this CTA's share, values own r .. own r + own - 1, as
    (totals, r, own) (r = %cluster_ctarank, own = len(values) / SPLIT: a tuple of totals)."""
    own = len(values) // SPLIT
    totals = hl.inline_asm_elementwise(  # one output is a tensor, not a tuple
        MMA_CLUSTER_SUM_PTX[len(values), SPLIT, threads], ",".join(["=r"] * own + ["r"] * len(values)), values,
        dtype=(torch.float32,) * own if own > 1 else torch.float32, is_pure=True, pack=1,
    )
    totals = totals if own > 1 else (totals,)
    rank = hl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r,r", [q], dtype=torch.int32, is_pure=True,
                                     pack=1)
    return totals, rank, own


def gemv_cluster_store(out, bias, sums, q, g, gr, scale, M, N, HAS_BIAS, ROW_GROUPS, COL_GROUPS, SPLIT, CLUSTER):
    """mma_gemv_kernel's SPLIT > 1 parts as one cluster: `sums` are its 16 accumulators (row group r, column group c,
    slot i at 8 r + 4 c + i); the 4 ROW_GROUPS COL_GROUPS it runs, in that order, summed over the cluster
    (`cluster_totals`), into `out`. Nothing without CLUSTER."""
    if not CLUSTER:
        return
    values = [sums[8 * r + 4 * c + i] for r in range(ROW_GROUPS) for c in range(COL_GROUPS) for i in range(4)]
    totals, rank, own = cluster_totals(values, q, SPLIT, 128)
    for k in range(own):
        j = rank * own + k  # row group j / (4 COL_GROUPS), column group (j / 4) mod COL_GROUPS (1 or 2), slot j mod 4
        index, valid = out_index((j >> 2) & (COL_GROUPS - 1), q, g, gr + (j >> (COL_GROUPS + 1)), j & 3, M, N)
        store_out(out, bias, index, valid, totals[k] * scale, N, HAS_BIAS)


def cluster_store(out, bias, sums, q, g, gr, scale, M, N, HAS_BIAS, COL_GROUPS, col0, SPLIT, CLUSTER):
    """mma_m64_kernel's SPLIT > 1 parts as one cluster: the accumulators (`sums`: 4 per column group, flat) summed
    over the cluster (`cluster_totals`), into `out`. Nothing without CLUSTER."""
    if not CLUSTER:
        return
    totals, rank, own = cluster_totals(list(sums[:4 * COL_GROUPS]), q, SPLIT, 256)
    for k in range(own):
        j = rank * own + k  # the accumulator: column group j >> 2, slot j & 3
        index, valid = out_index(j >> 2, q, g, gr, j & 3, M, N, col0)
        store_out(out, bias, index, valid, totals[k] * scale, N, HAS_BIAS)


@helion.kernel(**KERNEL_SETTINGS)
def mma_m64_kernel(
    x64: torch.Tensor,
    xs: torch.Tensor,
    x_post: torch.Tensor,
    w: torch.Tensor,
    f: torch.Tensor,
    post: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor,
    tickets: torch.Tensor,
    M: hl.constexpr,
    N: hl.constexpr,
    K: hl.constexpr,
    BLOCK: hl.constexpr,
    W_ELEM: hl.constexpr,
    ENCODING: hl.constexpr,
    ACT_ELEM: hl.constexpr,
    ACT_SCALE: hl.constexpr,
    BLOCK_A: hl.constexpr,
    A_LAYOUT: hl.constexpr,
    HAS_BIAS: hl.constexpr,
    EVICT: hl.constexpr,
    PDL: hl.constexpr,
    WARPS: hl.constexpr,
    COL_GROUPS: hl.constexpr,
    SPLIT: hl.constexpr,
    WGMMA: hl.constexpr,
    AHEAD: hl.constexpr,
    TILE_M: hl.constexpr,
    CLUSTER: hl.constexpr,
    FRAGMENT_SUMS: hl.constexpr,
    WIDE_B: hl.constexpr,
) -> torch.Tensor:
    """As `mma_gemv_kernel` for M > 16 (COL_GROUPS = ceil(min(M, 64) / 8) groups of 8 activation
    rows): a program is 8 warps (256 threads) of one 16-row group each, 128 weight rows, and TILE_M (64, or
    with WGMMA 128: the decoded weights for two wgmma) activation rows (tile_m: programs over M, the weights'
    rows first); each thread loads and decodes one lane's share of the window's B (row tid >> 2, the 16 K of lane
    tid & 3), the program writes it into shared memory, and each warp runs its group's A
    fragments against every column group: with WGMMA (sm_90) one wgmma m64nNk16 per 16 K
    and warpgroup (N = 8 COL_GROUPS, B read from shared memory by the tensor cores), else 8
    mma.sync per 16 K reading B with ld.shared. Window w + AHEAD's words are loaded before window
    w's barrier (AHEAD 2 and 3 were no faster on the H100: docs/DECODE_NOTES.md).
    With SPLIT > 1 (parts of W / SPLIT or W / SPLIT + 1 of the K / 64 windows W where SPLIT does not divide them: a
    part's loads past its end then read the last window of K, unused) the parts of an output tile add their fp32 sums
    into a workspace (the last by ticket stores), or
    with CLUSTER, launched as one thread-block cluster of SPLIT CTAs (`launch.DirectLaunch`), through distributed
    shared memory (`cluster_store`); Triton's own launch (a shape's first call) runs without clusters, and the
    kernel takes the workspace path when %cluster_nctarank says so. With FRAGMENT_SUMS that workspace is in fragment
    order (`add_fragments`, `store_fragments`: one vector reduction per column group), else at the outputs'
    positions. H100, M = 64, clusters / workspace: 10240 x 8192 1.37x-1.65x / 1.12x-1.36x, 57344 x 8192 1.49x-1.83x /
    1.29x-1.62x (b085d76, 93dd6fb).
    H100, M = 64, the four Llama-3-70B shapes, x cuBLAS bf16: 1.14x-1.95x (9b4b358; 67784e5: 1.18x-1.73x,
    mma.sync 1.07x-1.14x at 8192^2 where wgmma gave 1.33x-1.42x); N = K = 8192, M = 128 to 4096: 0.43x-0.82x,
    1.1x-7.5x faster in each of the 28 cells than the other kernels on the k_order copy (5aee332)."""
    windows = K // 64
    steps = windows // SPLIT
    # SPLIT that does not divide the windows (config "split"): part p runs windows p W / SPLIT .. (p + 1) W / SPLIT
    uneven = windows % SPLIT != 0
    blocks = 64 // BLOCK
    # WARPS 16 (TILE_M 128): 256 weight rows a program, each thread one activation row's share of the window
    rows, tiles_m = N // (16 * WARPS), (M + TILE_M - 1) // TILE_M
    for program in hl.tile(SPLIT * rows * tiles_m, block_size=1):
        # program rows first: consecutive programs share their TILE_M activation rows, and the weights (32 MB at
        # N = K = 8192 for fp4) stay in L2 from one tile of the activation to the next; the K parts last (the parts
        # of an output tile run apart: their workspace adds do not meet), or with CLUSTER first (a cluster's CTAs
        # are consecutive programs)
        pid = program.begin
        part = pid % SPLIT if CLUSTER else pid // (rows * tiles_m)
        tile = pid // SPLIT if CLUSTER else pid % (rows * tiles_m)
        tile_p, tile_m = tile % rows, tile // rows
        tid = thread_ids(32 * WARPS)
        if PDL:
            tid = grid_wait(tid)
        lane = tid & 31
        g = lane >> 2
        q = lane & 3
        gr = tile_p * WARPS + (tid >> 5)  # the warp's row group
        # the first activation row (0 spelled out for one tile: ptxas took 38 more registers at M = 64 when it
        # could not see that)
        col0 = tile_m * TILE_M if M > TILE_M else 0
        r = col0 + (tid >> 2)
        row = torch.where(r < M, r, M - 1)  # the thread's B row (past M: the last)
        row_2 = torch.where(r + 64 < M, r + 64, M - 1)  # TILE_M 128: its row in the second 64
        # accumulators s<c><i>: column group c, accumulator i (Helion carries tensors, not tuples)
        (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33, s40, s41, s42, s43, s50, s51,
         s52, s53, s60, s61, s62, s63, s70, s71, s72, s73) = zero_sums(32 * WARPS, 32)
        if TILE_M == 128:  # t<c><i>: the second 64 activation rows
            (t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, t30, t31, t32, t33, t40, t41, t42, t43, t50,
             t51, t52, t53, t60, t61, t62, t63, t70, t71, t72, t73) = zero_sums(32 * WARPS, 32)
        # AHEAD windows ahead: window w + AHEAD's words are loaded before window w's barrier, which
        # ptxas does not move them past; windows w .. w + AHEAD - 1 wait in carried tensors, sets
        # p (w), u (w + 1), v (w + 2) of 10: `window_words` (wrapping at the end: in bounds, unused)
        first, count = part_windows(part, windows, steps, SPLIT, uneven)
        # (a constant operand: with the post-scales loaded here for it, ptxas scheduled the K loop's loads later and
        # mxfp8 x mxfp4 at M = 64, 8192^2 took 42.4 instead of 36.0 us; the scales are read after the loop)
        ctas = cluster_arrive(hl.zeros([], dtype=torch.int32), CLUSTER)
        size, align = m64_exchange_buffer(WGMMA, TILE_M)
        b_buffer = shared_buffer(size, 32 * WARPS, align)
        p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = window_words(x64, xs, w, f, row, gr, first, lane, q, g, windows, blocks, K,
                                                              ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, WIDE_B)
        if TILE_M == 128 and WARPS == 8:  # (AHEAD 1) the second row's B share of window w, set o
            o0, o1, o2, o3, o4 = pad_slots(b_words(x64, xs, row_2, first, q, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT))
        if AHEAD > 1:
            u0, u1, u2, u3, u4, u5, u6, u7, u8, u9 = window_words(
                x64, xs, w, f, row, gr, ahead_window(first, 1, steps, windows, uneven), lane, q, g, windows, blocks, K,
                ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, WIDE_B)
        if AHEAD > 2:
            v0, v1, v2, v3, v4, v5, v6, v7, v8, v9 = window_words(
                x64, xs, w, f, row, gr, ahead_window(first, 2, steps, windows, uneven), lane, q, g, windows, blocks, K,
                ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, WIDE_B)
        for it in hl.tile(count, block_size=1):
            win = first + it.begin
            n0, n1, n2, n3, n4, n5, n6, n7, n8, n9 = window_words(
                x64, xs, w, f, row, gr, ahead_window(first, it.begin + AHEAD, steps, windows, uneven), lane, q, g,
                windows, blocks, K, ACT_ELEM, BLOCK_A, A_LAYOUT, EVICT, WIDE_B)
            loaded_b = unpad_slots((p0, p1, p2, p3, p4), b_word_count(ACT_ELEM))
            if TILE_M == 128 and WARPS == 16:  # 512 threads: one share each of the 128 rows
                address = wgmma_exchange_128((b_registers(loaded_b, ACT_ELEM, ACT_SCALE),), win, b_buffer, ACT_ELEM)
            elif TILE_M == 128:
                m0, m1, m2, m3, m4 = pad_slots(b_words(x64, xs, row_2, ahead_window(first, it.begin + 1, steps, windows,
                                                                                    uneven), q, K, ACT_ELEM, BLOCK_A,
                                                       A_LAYOUT, EVICT))
                loaded_b_2 = unpad_slots((o0, o1, o2, o3, o4), b_word_count(ACT_ELEM))
                address = wgmma_exchange_128((b_registers(loaded_b, ACT_ELEM, ACT_SCALE),
                                              b_registers(loaded_b_2, ACT_ELEM, ACT_SCALE)), win, b_buffer, ACT_ELEM)
            else:
                address = m64_exchange(b_registers(loaded_b, ACT_ELEM, ACT_SCALE), win, b_buffer, ACT_ELEM, WGMMA)
            frags = a_fragments([p5, p6, p7, p8, p9], W_ELEM, ENCODING)
            if WGMMA:
                (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33, s40, s41, s42, s43,
                 s50, s51, s52, s53, s60, s61, s62, s63, s70, s71, s72, s73) = wgmma_window(frags, address, (
                    s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32, s33, s40, s41, s42, s43,
                    s50, s51, s52, s53, s60, s61, s62, s63, s70, s71, s72, s73), COL_GROUPS)
                if TILE_M == 128:  # the same weights on rows 64 .. 127 of the window, 8 KB further
                    (t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, t30, t31, t32, t33, t40, t41, t42, t43,
                     t50, t51, t52, t53, t60, t61, t62, t63, t70, t71, t72, t73) = wgmma_window(frags, second_64_rows(
                        address), (t00, t01, t02, t03, t10, t11, t12, t13, t20, t21, t22, t23, t30, t31, t32,
                                              t33, t40, t41, t42, t43, t50, t51, t52, t53, t60, t61, t62, t63, t70,
                                              t71, t72, t73), COL_GROUPS)
            else:
                s00, s01, s02, s03 = mma_window_m64(frags, address, 0, (s00, s01, s02, s03))
                s10, s11, s12, s13 = mma_window_m64(frags, address, 1, (s10, s11, s12, s13))
                s20, s21, s22, s23 = mma_window_m64(frags, address, 2, (s20, s21, s22, s23))
                if COL_GROUPS > 3:
                    s30, s31, s32, s33 = mma_window_m64(frags, address, 3, (s30, s31, s32, s33))
                if COL_GROUPS > 4:
                    s40, s41, s42, s43 = mma_window_m64(frags, address, 4, (s40, s41, s42, s43))
                if COL_GROUPS > 5:
                    s50, s51, s52, s53 = mma_window_m64(frags, address, 5, (s50, s51, s52, s53))
                if COL_GROUPS > 6:
                    s60, s61, s62, s63 = mma_window_m64(frags, address, 6, (s60, s61, s62, s63))
                if COL_GROUPS > 7:
                    s70, s71, s72, s73 = mma_window_m64(frags, address, 7, (s70, s71, s72, s73))
            if AHEAD == 1:
                p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = n0, n1, n2, n3, n4, n5, n6, n7, n8, n9
                if TILE_M == 128 and WARPS == 8:
                    o0, o1, o2, o3, o4 = m0, m1, m2, m3, m4
            elif AHEAD == 2:
                p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = u0, u1, u2, u3, u4, u5, u6, u7, u8, u9
                u0, u1, u2, u3, u4, u5, u6, u7, u8, u9 = n0, n1, n2, n3, n4, n5, n6, n7, n8, n9
            else:
                p0, p1, p2, p3, p4, p5, p6, p7, p8, p9 = u0, u1, u2, u3, u4, u5, u6, u7, u8, u9
                u0, u1, u2, u3, u4, u5, u6, u7, u8, u9 = v0, v1, v2, v3, v4, v5, v6, v7, v8, v9
                v0, v1, v2, v3, v4, v5, v6, v7, v8, v9 = n0, n1, n2, n3, n4, n5, n6, n7, n8, n9
        s00 = launch_dependents(s00, PDL)
        scale = post[0] * x_post[0]
        first_sums = ((s00, s01, s02, s03), (s10, s11, s12, s13), (s20, s21, s22, s23), (s30, s31, s32, s33),
                      (s40, s41, s42, s43), (s50, s51, s52, s53), (s60, s61, s62, s63), (s70, s71, s72, s73))
        second_sums = first_sums  # TILE_M 64: unused (Helion needs one type for the name on both branches)
        if TILE_M == 128:
            second_sums = ((t00, t01, t02, t03), (t10, t11, t12, t13), (t20, t21, t22, t23), (t30, t31, t32, t33),
                           (t40, t41, t42, t43), (t50, t51, t52, t53), (t60, t61, t62, t63), (t70, t71, t72, t73))
        sums = m64_sums(first_sums, second_sums, TILE_M)
        groups = COL_GROUPS * (TILE_M // 64)
        if SPLIT == 1:
            store_groups(out, bias, sums, gr, q, g, scale, M, N, HAS_BIAS, 1, groups, None, col0)
        else:
            # Helion 1.5.0 does not compile a data-dependent if that reads a tuple (`sums`) or has an else: the
            # accumulators pass by name, and the workspace adds are masked instead
            if ctas == SPLIT:  # launched in clusters of the SPLIT parts (CLUSTER: `launch.DirectLaunch`)
                cluster_store(out, bias, (s00, s01, s02, s03, s10, s11, s12, s13, s20, s21, s22, s23, s30, s31, s32,
                                          s33, s40, s41, s42, s43, s50, s51, s52, s53, s60, s61, s62, s63, s70, s71,
                                          s72, s73), q, g, gr, scale, M, N, HAS_BIAS, groups, col0, SPLIT, CLUSTER)
            if FRAGMENT_SUMS:
                add_fragments(workspace, sums, tile, tid, groups, ctas != SPLIT)
            else:
                add_groups(workspace, sums, gr, q, g, M, N, 1, groups, col0, ctas != SPLIT)
            if ctas != SPLIT:
                cluster_wait(q, CLUSTER)
                hl.inline_triton("tl.debug_barrier()", args=(), output_like=None)
                ticket = hl.atomic_add(tickets, [tile], 1, sem="acq_rel")  # the output tile's
                if ticket == SPLIT - 1:
                    if FRAGMENT_SUMS:
                        store_fragments(out, bias, workspace, tile, tid, q, g, gr, scale, M, N, HAS_BIAS, groups, col0)
                    else:
                        store_sums(out, bias, workspace, gr, q, g, scale, M, N, HAS_BIAS, 1, groups, col0)
                    hl.store(tickets, [tile], 0)
    return out
