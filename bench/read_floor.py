"""`python -m bench.read_floor`: how fast a kernel can read the decode shapes' weight bytes on this GPU.

A Triton kernel that only reads (16-byte loads, the xor of each program's words stored so that the loads stay) over
grids of several shapes: programs of 4, 8 or 16 warps, one or two loads per thread per step, from a quarter of a wave
(each program looping over a long chunk) to many waves of one step each. CUDA-graph replay over copies past 2x L2, next
to cuBLAS bf16 at M = 1 and 16 and a device-to-device copy, one process. The fastest grid is the `read_weights`
provider of `python -m bench` (`read_fn`): the floor a decode kernel's ratio to cuBLAS bf16 is measured against.

Three other sweeps replace the grids above on one-wave grids of 16 to 64 warps per SM: `--ring` (`ring_words`, each warp
reading through a ring of bulk copies into shared memory), `--grouped` (`grouped_words`, contiguous runs per warp, per
group of warps or per program) and `--activation` (`grouped_words` with reads of one L2-resident buffer beside the
weights, as the M = 16 kernels read their activation). `--multicast` times the M = 16 slice plan's grid (128 programs of
32 warps) with its activation read beside the weights as plain L2 loads of 512, 256 or 128 B per 512 B of weights, or
through bulk copies into shared-memory rings, multicast in thread-block clusters (`mcast_words`). H100 results:
docs/DECODE_NOTES.md, 2026-11-26.
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from .providers import operand_bytes, weight_bytes

# The grid of `read_fn`: 8 warps, two 16-byte loads per thread, one step per program (8 KB), so 4608 programs at
# N = K = 8192 for nvfp4 weights. H100, that shape: 13.75 us (the fastest of the sweep) against 13.9-14.4 us for one
# full wave of programs that loop and 14.8-20.0 us for a quarter wave (bench/results/h100_read_floor_3155e8a_2026-11-25.log).
READ_WARPS = 8
READ_LOADS = 2


@triton.jit
def read_words(words, out, n_words, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Each program reads CHUNK int32 words (BLOCK per step) and stores their xor at out[program]."""
    pid = tl.program_id(0)
    acc = tl.zeros([BLOCK], tl.int32)
    for i in range(0, CHUNK, BLOCK):
        offs = pid.to(tl.int64) * CHUNK + i + tl.arange(0, BLOCK)
        acc ^= tl.load(words + offs, mask=offs < n_words, other=0)
    tl.store(out + pid, tl.xor_sum(acc, 0))


def step_words(warps: int, loads: int) -> int:
    """int32 words a program of `warps` warps reads per step: `loads` 16-byte loads per thread."""
    return warps * 32 * 4 * loads


def read_launcher(words: torch.Tensor, warps: int, loads: int, programs: int):
    """A call of `read_words` over the int32 `words` by about `programs` programs of `warps` warps, `loads` 16-byte
    loads per thread per step; returns (call, out): out[:grid] holds the programs' xors after a call."""
    block = step_words(warps, loads)
    chunk = triton.cdiv(triton.cdiv(words.numel(), programs), block) * block
    grid = triton.cdiv(words.numel(), chunk)
    out = torch.empty(grid, device=words.device, dtype=torch.int32)
    return (lambda: read_words[(grid,)](words, out, words.numel(), chunk, block, num_warps=warps)), out


def xor_all(t: torch.Tensor) -> int:
    """The xor of every int32 of `t` (pairwise halving)."""
    t = t.reshape(-1)
    while t.numel() > 1:
        if t.numel() % 2:
            t = torch.cat([t, t.new_zeros(1)])
        t = t[0::2] ^ t[1::2]
    return int(t)


def checked_read(words: torch.Tensor, warps: int = READ_WARPS, loads: int = READ_LOADS, programs: int | None = None):
    """`read_launcher`, called once and checked: the programs' xors together must be the xor of every word."""
    call, out = read_launcher(words, warps, loads, programs or triton.cdiv(words.numel(), step_words(warps, loads)))
    call()
    if xor_all(out) != xor_all(words):
        raise AssertionError(f"read_words ({warps} warps, {loads} loads, {out.numel()} programs) missed words")
    return call


def weight_words(b) -> torch.Tensor:
    """The weight bytes of QTensor `b` (data and scales) as one int32 buffer (zero-padded to 4 bytes)."""
    raw = weight_bytes(b)
    return torch.nn.functional.pad(raw, (0, -raw.numel() % 4)).view(torch.int32)


def read_fn(b):
    """The `read_weights` provider: a read of `b`'s bytes by `read_words` on the `READ_*` grid."""
    return checked_read(weight_words(b))


# A TMA ring (cp.async.bulk into shared memory, one mbarrier per slot): each warp streams its own contiguous run of
# bytes through its own S slots of CH bytes, lane 0 issuing the copy of step i + S once the warp has read step i. The
# bytes in flight per warp are S x CH, held in shared memory instead of registers, for one bulk copy per step.
def ring_init_ptx(warps: int, slots: int, chunk: int) -> str:
    """Outputs $0, $1: the shared addresses of the ring and of its mbarriers; input $2: the warp's first byte.
    Lane 0 of each warp initializes the warp's `slots` mbarriers and requests its first `slots` chunks."""
    copies = "".join(
        f"@p mbarrier.arrive.expect_tx.shared::cta.b64 st, [bb+{8 * s}], {chunk}; add.u64 g, $2, {s * chunk}; "
        f"@p cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [rb+{s * chunk}], [g], {chunk}, "
        f"[bb+{8 * s}]; " for s in range(slots))
    inits = "".join(f"@p mbarrier.init.shared::cta.b64 [bb+{8 * s}], 1; " for s in range(slots))
    return (f"{{ .shared .align 128 .b8 ring[{warps * slots * chunk}]; .shared .align 8 .b64 bars[{warps * slots}]; "
            ".reg .pred p; .reg .u32 t, l, w, rb, bb; .reg .u64 st, g; "
            "mov.u32 t, %tid.x; and.b32 l, t, 31; shr.u32 w, t, 5; setp.eq.u32 p, l, 0; "
            f"mov.u32 rb, ring; mad.lo.u32 rb, w, {slots * chunk}, rb; mov.u32 bb, bars; mad.lo.u32 bb, w, {slots * 8}, bb; "
            f"{inits}fence.mbarrier_init.release.cluster; fence.proxy.async.shared::cta; bar.warp.sync -1; {copies}"
            "mov.u32 $0, ring; mov.u32 $1, bars; }")


def ring_step_ptx(slots: int, chunk: int) -> str:
    """Output $0: the xor of the thread's words of step $5 (its 16 bytes of each 512); inputs $1 ring, $2 mbarriers
    (`ring_init_ptx`), $3 the warp's first byte, $4 step, $5 steps. Waits for the step's slot, reads it, and lane 0
    requests step + slots into it."""
    log2 = slots.bit_length() - 1
    reads = "".join(f"ld.shared.v4.b32 {{x0, x1, x2, x3}}, [a+{512 * k}]; xor.b32 x0, x0, x1; xor.b32 x2, x2, x3; "
                    "xor.b32 x, x, x0; xor.b32 x, x, x2; " for k in range(chunk // 512))
    return ("{ .reg .pred p, q, d; .reg .u32 t, l, w, s, ph, rb, bb, a, j, x, x0, x1, x2, x3; .reg .u64 g, st; "
            "mov.u32 t, %tid.x; and.b32 l, t, 31; shr.u32 w, t, 5; setp.eq.u32 p, l, 0; "
            f"and.b32 s, $4, {slots - 1}; shr.u32 ph, $4, {log2}; and.b32 ph, ph, 1; "
            f"mad.lo.u32 bb, w, {slots}, s; mad.lo.u32 rb, bb, {chunk}, $1; mad.lo.u32 bb, bb, 8, $2; "
            "WAIT: mbarrier.try_wait.parity.shared::cta.b64 d, [bb], ph; @!d bra WAIT; "
            f"mad.lo.u32 a, l, 16, rb; mov.u32 x, 0; {reads}bar.warp.sync -1; "
            f"add.u32 j, $4, {slots}; setp.lt.and.u32 q, j, $5, p; mul.wide.u32 g, j, {chunk}; add.u64 g, g, $3; "
            f"@q mbarrier.arrive.expect_tx.shared::cta.b64 st, [bb], {chunk}; "
            f"@q cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [rb], [g], {chunk}, [bb]; "
            "mov.b32 $0, x; }")


@triton.jit
def ring_words(words, out, WARP_WORDS: tl.constexpr, STEPS: tl.constexpr, WARPS: tl.constexpr, INIT: tl.constexpr,
               STEP: tl.constexpr):
    """Each warp reads its WARP_WORDS int32 words (from (program * WARPS + warp) * WARP_WORDS) through its ring in
    STEPS steps; each thread stores the xor of the words it read at out[program * 32 WARPS + thread]."""
    pid = tl.program_id(0)
    t = tl.arange(0, WARPS * 32)
    src = (words + (pid * WARPS + t // 32).to(tl.int64) * WARP_WORDS).to(tl.int64)
    ring, bars = tl.inline_asm_elementwise(INIT, "=r,=r,l", [src], dtype=(tl.int32, tl.int32), is_pure=False, pack=1)
    acc = tl.zeros([WARPS * 32], tl.int32)
    steps = tl.full([WARPS * 32], STEPS, tl.int32)
    for i in range(STEPS):
        acc ^= tl.inline_asm_elementwise(STEP, "=r,r,r,l,r,r", [ring, bars, src, steps * 0 + i, steps],
                                         dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out + pid * WARPS * 32 + t, acc)


def check_prefix(out: torch.Tensor, words: torch.Tensor, read: int, what: str):
    """The xor of the words a reader stored in `out` must be the xor of the first `read` of `words`."""
    if xor_all(out) != xor_all(words[:read]):
        raise AssertionError(f"{what} missed words")


def checked_ring_read(words: torch.Tensor, warps: int, slots: int, chunk: int, programs: int):
    """A call of `ring_words` by `programs` programs of `warps` warps (`slots` slots of `chunk` bytes per warp) over
    the longest prefix of `words` that they split evenly, called once and checked like `checked_read`; returns
    (call, bytes read)."""
    steps = words.numel() * 4 // (programs * warps * chunk)
    warp_words = steps * chunk // 4
    if steps < slots:
        raise ValueError(f"ring of {slots} slots needs at least {slots} steps per warp, got {steps}")
    out = torch.empty(programs * warps * 32, device=words.device, dtype=torch.int32)
    kernel_args = dict(WARP_WORDS=warp_words, STEPS=steps, WARPS=warps, INIT=ring_init_ptx(warps, slots, chunk),
                       STEP=ring_step_ptx(slots, chunk), num_warps=warps)
    call = lambda: ring_words[(programs,)](words, out, **kernel_args)  # noqa: E731
    call()
    read = programs * warps * warp_words
    check_prefix(out, words, read, f"ring_words ({warps} warps, {slots} x {chunk} B, {programs} programs)")
    return call, read * 4


@triton.jit
def grouped_words(words, act, out, STEPS: tl.constexpr, WARPS: tl.constexpr, GROUP: tl.constexpr, LOADS: tl.constexpr,
                  ACT_LOADS: tl.constexpr, ACT_WORDS: tl.constexpr, ACT_VEC: tl.constexpr = 4):
    """Each warp reads LOADS consecutive 512-byte blocks per step (16 bytes per lane each), STEPS steps; the GROUP
    warps w // GROUP of a program read one contiguous GROUP x LOADS blocks per step, and each such group of warps runs
    through its own contiguous run (GROUP 1: one run per warp; GROUP WARPS: one per program). Each thread stores the
    xor of its words at out[program * 32 WARPS + thread]. With ACT_LOADS, each warp also reads ACT_LOADS 512-byte
    blocks per step of `act` (ACT_WORDS int32 words, the same for every program, so read at L2 as the mma kernels'
    activation is: block (step * WARPS + warp) * ACT_LOADS + j, cyclically; blocks of 32 ACT_VEC words, ACT_VEC per
    lane) and stores their xor at
    out[(programs + program) * 32 WARPS + thread]."""
    pid = tl.program_id(0)
    t = tl.arange(0, WARPS * 32)
    warp, lane = t // 32, t % 32
    run = (pid * (WARPS // GROUP) + warp // GROUP).to(tl.int64)
    acc = tl.zeros([WARPS * 32, 4], tl.int32)
    act_acc = tl.zeros([WARPS * 32, ACT_VEC], tl.int32)
    for i in range(STEPS):
        for j in tl.static_range(LOADS):
            block = ((run * STEPS + i) * GROUP + warp % GROUP) * LOADS + j
            acc ^= tl.load(words + (block * 128 + lane * 4)[:, None] + tl.arange(0, 4)[None, :])
        for j in tl.static_range(ACT_LOADS):
            offset = (((i * WARPS + warp) * ACT_LOADS + j) * 32 * ACT_VEC + lane * ACT_VEC) % ACT_WORDS
            act_acc ^= tl.load(act + offset[:, None] + tl.arange(0, ACT_VEC)[None, :])
    tl.store(out + pid * WARPS * 32 + t, tl.xor_sum(acc, 1))
    if ACT_LOADS > 0:
        tl.store(out + (tl.num_programs(0) + pid) * WARPS * 32 + t, tl.xor_sum(act_acc, 1))


def checked_grouped_read(words: torch.Tensor, warps: int, group: int, loads: int, programs: int,
                         act: torch.Tensor | None = None, act_loads: int = 0, act_vec: int = 4):
    """A call of `grouped_words` over the longest prefix of `words` that its grid splits evenly (and `act_loads`
    blocks of `act` per warp and step), called once and checked like `checked_read` (the weight words only);
    returns (call, bytes of `words` read)."""
    steps = words.numel() // (programs * warps * loads * 128)
    out = torch.empty(2 * programs * warps * 32, device=words.device, dtype=torch.int32)
    act = words if act is None else act
    call = lambda: grouped_words[(programs,)](words, act, out, steps, warps, group, loads, act_loads,  # noqa: E731
                                              act.numel(), act_vec, num_warps=warps)
    call()
    read = programs * warps * loads * 128 * steps
    check_prefix(out[:programs * warps * 32], words, read,
                 f"grouped_words ({warps} warps, group {group}, {loads} loads, {programs} programs)")
    return call, read * 4


# The M = 16 slice plan's activation through thread-block clusters (`--multicast`): a program of 8 K slices of 4 warps
# (1024 threads) reads its weights with plain 16-byte loads (512 B per warp and step, one run per warp) and each slice
# one 64-K window (2 KB) of a [16, K] bf16 activation per step from a 2-slot ring in shared memory that bulk copies
# fill (rows 16 B more than their bytes apart, so that rows g and g + 1 fall 4 banks apart). In a cluster of C CTAs
# (programs on the same K windows) CTA r copies rows r, r + C, .. and multicasts them to every CTA of the cluster, so L2
# serves each window once per cluster instead of once per program. Each slot has a full mbarrier (one arrival: the
# producer arming the slot's bytes) and an empty one (an arrival from every warp reading the slot, in every CTA); the
# producer waits for its empty slot before it copies the step two ahead. The arrivals and waits keep their default
# CTA-scope release / acquire, as CUTLASS's cluster barriers do: at cluster scope each arrival is a MEMBAR.GPU that waits
# for the warp's weight loads in flight, and each wait invalidates L1 (H100, 8192^2 nvfp4 bytes, one ring: 38.6 against
# 25.4 us). Rings (`shared`): each slice its own ring of one window per row (16 copies of 128 B per step and slice), or
# one ring for the program, the slices on interleaved windows (slice s on window 8 i + s at step i: one copy of 1 KB
# per row and step).
MCAST_SLICES = 8


def mcast_geometry(shared: bool) -> tuple[int, int, int, int]:
    """(rings per program, bytes per row and step, bytes between rows in a slot, warps reading a slot)."""
    row = 128 * MCAST_SLICES if shared else 128
    return (1 if shared else MCAST_SLICES), row, row + 16, (32 if shared else 4)


def _mcast_issue(slot: int, offset: int, row_bytes: int, shared: bool) -> str:
    """PTX: the producer (predicate p) arms the full mbarrier at fb + 8 `slot` with a step's bytes and copies its rows
    (j mod C == rank) of the step at base + `offset` (base moves there) into the slot at rb + `slot` x slot bytes,
    multicast to every CTA of the cluster."""
    _, row, stride, _ = mcast_geometry(shared)
    copies = "".join(
        f"and.b32 d, cm, {j}; setp.eq.and.u32 pj, d, r, p; add.u64 src, base, {j * row_bytes}; "
        f"@pj cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster "
        f"[rb+{slot * 16 * stride + j * stride}], [src], {row}, [fb+{8 * slot}], mask; " for j in range(16))
    return (f"@p mbarrier.arrive.expect_tx.shared::cta.b64 st, [fb+{8 * slot}], {16 * row}; "
            f"add.u64 base, base, {offset}; {copies}")


def _mcast_common(shared: bool) -> str:
    """PTX declarations and set-up shared by `mcast_init_ptx` and `mcast_step_ptx`: thread ids, sl (the thread's ring),
    p (its producer), r and c (rank and size of the cluster, 1 without clusters), cm = c - 1, the multicast mask."""
    return (".reg .pred p, pj, dn, lp, q; .reg .u32 t, sl, l, m, c, r, cm, d, rb, fb, eb, cnt, s, ph, a, g, qq, ra, x, "
            "x0, x1, x2, x3, j; .reg .b16 mask; .reg .u64 st, src, base; "
            f"mov.u32 t, %tid.x; shr.u32 sl, t, {10 if shared else 7}; and.b32 l, t, 31; "
            f"and.b32 m, t, {1023 if shared else 127}; setp.eq.u32 p, m, 0; "
            "mov.u32 r, %cluster_ctarank; mov.u32 c, %cluster_nctarank; sub.u32 cm, c, 1; "
            "mov.u32 m, 1; shl.b32 m, m, c; sub.u32 m, m, 1; cvt.u16.u32 mask, m; ")


def _mcast_base(steps: int, step: str, act: str, shared: bool) -> str:
    """PTX: base = the address of the thread's ring's step `step` in row 0 of the activation at `act`."""
    _, row, _, _ = mcast_geometry(shared)
    return (f"mul.wide.u32 base, sl, {steps * 128}; add.u64 base, base, {act}; mul.wide.u32 src, {step}, {row}; "
            "add.u64 base, base, src; ")


def mcast_init_ptx(steps: int, row_bytes: int, shared: bool) -> str:
    """Outputs $0, $1: the shared addresses of the rings and of the mbarriers; input $2: the activation's address.
    Initializes the mbarriers, waits for the cluster, and copies steps 0 and 1."""
    rings, row, stride, readers = mcast_geometry(shared)
    return ("{ .shared .align 128 .b8 mring[" + str(rings * 32 * stride) + "]; .shared .align 8 .b64 mbars["
            + str(4 * rings) + "]; " + _mcast_common(shared) +
            f"mov.u32 fb, mbars; mad.lo.u32 fb, sl, 16, fb; add.u32 eb, fb, {16 * rings}; mul.lo.u32 cnt, c, {readers}; "
            f"mov.u32 rb, mring; mad.lo.u32 rb, sl, {32 * stride}, rb; "
            "@p mbarrier.init.shared::cta.b64 [fb], 1; @p mbarrier.init.shared::cta.b64 [fb+8], 1; "
            "@p mbarrier.init.shared::cta.b64 [eb], cnt; @p mbarrier.init.shared::cta.b64 [eb+8], cnt; "
            "fence.mbarrier_init.release.cluster; barrier.cluster.arrive.release.aligned; "
            "barrier.cluster.wait.acquire.aligned; mov.u32 j, 0; " + _mcast_base(steps, "j", "$2", shared)
            + _mcast_issue(0, 0, row_bytes, shared) + _mcast_issue(1, row, row_bytes, shared) +
            "mov.u32 $0, mring; mov.u32 $1, mbars; }")


def mcast_step_ptx(steps: int, row_bytes: int, shared: bool) -> str:
    """Output $0: the xor of the thread's 64 bytes of its slice's window at step $4 (rows g and g + 8, bytes 32 q ..
    32 q + 32 of the slice's 128); inputs $1 rings, $2 mbarriers (`mcast_init_ptx`), $3 the activation's address, $4
    the step. Waits for the slot, reads it, releases it to every CTA of the cluster, and the producer copies step
    $4 + 2 into it."""
    rings, row, stride, _ = mcast_geometry(shared)
    reads = "".join(f"ld.shared.v4.b32 {{x0, x1, x2, x3}}, [a+{o}]; xor.b32 x0, x0, x1; xor.b32 x2, x2, x3; "
                    "xor.b32 x, x, x0; xor.b32 x, x, x2; " for o in (0, 16, 8 * stride, 8 * stride + 16))
    column = "shr.u32 d, t, 7; mad.lo.u32 a, d, 128, a; " if shared else ""  # the slice's window in the row
    return ("{ " + _mcast_common(shared) +
            "and.b32 s, $4, 1; shr.u32 ph, $4, 1; and.b32 ph, ph, 1; "
            f"mad.lo.u32 fb, sl, 16, $2; mad.lo.u32 fb, s, 8, fb; add.u32 eb, fb, {16 * rings}; "
            f"mad.lo.u32 rb, sl, 2, s; mad.lo.u32 rb, rb, {16 * stride}, $1; "
            "MCW${:uid}: mbarrier.try_wait.parity.shared::cta.b64 dn, [fb], ph; @!dn bra MCW${:uid}; "
            f"shr.u32 g, l, 2; and.b32 qq, l, 3; mad.lo.u32 a, g, {stride}, rb; mad.lo.u32 a, qq, 32, a; {column}"
            "mov.u32 x, 0; " + reads + "bar.warp.sync -1; setp.lt.u32 lp, l, c; @lp mapa.shared::cluster.u32 ra, eb, l; "
            "@lp mbarrier.arrive.shared::cluster.b64 _, [ra]; "
            f"add.u32 j, $4, 2; setp.lt.and.u32 q, j, {steps}, p; @!q bra MCD${{:uid}}; "
            "MCE${:uid}: mbarrier.try_wait.parity.shared::cta.b64 dn, [eb], ph; @!dn bra MCE${:uid}; "
            + _mcast_base(steps, "j", "$3", shared) + _mcast_issue(0, 0, row_bytes, shared)
            + "MCD${:uid}: mov.b32 $0, x; }")


MCAST_FINI_PTX = "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;"


@triton.jit
def mcast_words(words, act, out, STEPS: tl.constexpr, ACT: tl.constexpr, INIT: tl.constexpr, STEP: tl.constexpr,
                FINI: tl.constexpr):
    """32 warps per program: each warp reads 512 B of its own run of `words` per step (STEPS steps) and stores the xor
    of its words at out[program * 1024 + thread]; with ACT each 128 threads (a K slice) also read one window of `act`
    per step through the cluster's multicast ring (`mcast_step_ptx`) and store the xor of what they read at
    out[(programs + program) * 1024 + thread]."""
    pid = tl.program_id(0)
    t = tl.arange(0, 1024)
    warp, lane = t // 32, t % 32
    acc = tl.zeros([1024, 4], tl.int32)
    act_acc = tl.zeros([1024], tl.int32)
    act_address = (act + t * 0).to(tl.int64)
    if ACT:
        ring, bars = tl.inline_asm_elementwise(INIT, "=r,=r,l", [act_address], dtype=(tl.int32, tl.int32), is_pure=False,
                                               pack=1)
    for i in range(STEPS):
        block = (pid * 32 + warp).to(tl.int64) * STEPS + i
        acc ^= tl.load(words + (block * 128 + lane * 4)[:, None] + tl.arange(0, 4)[None, :])
        if ACT:
            act_acc ^= tl.inline_asm_elementwise(STEP, "=r,r,r,l,r", [ring, bars, act_address, t * 0 + i],
                                                 dtype=tl.int32, is_pure=False, pack=1)
    if ACT:
        act_acc ^= tl.inline_asm_elementwise(FINI, "=r,r", [t], dtype=tl.int32, is_pure=False, pack=1)
    tl.store(out + pid * 1024 + t, tl.xor_sum(acc, 1))
    if ACT:
        tl.store(out + (tl.num_programs(0) + pid) * 1024 + t, act_acc)


def cluster_call(jit_fn, grid: int, cluster: int, args: tuple, num_warps: int):
    """A call of the Triton kernel `jit_fn` (`args`: every parameter, constexprs included, in order) on `grid` programs
    as thread-block clusters of `cluster` consecutive programs, by `kernels.launch.DirectLaunch`; its first launch, made
    here, goes through Triton without clusters."""
    from triton.backends.nvidia.compiler import CUDAOptions

    from blockscaled.kernels.launch import DirectLaunch

    launch = DirectLaunch(cluster)
    call = lambda: launch(jit_fn, (grid,), *args, num_warps=num_warps,  # noqa: E731
                          num_stages=CUDAOptions.num_stages)  # Triton's default, as a plain launch
    call()
    return call


def checked_mcast_read(words: torch.Tensor, act: torch.Tensor | None, programs: int, cluster: int, shared: bool = False):
    """A call of `mcast_words` (with `act`, a [16, K] bf16 activation of 8 K slices of one window per step, else the
    weights only) over the longest prefix of `words` its grid splits evenly, in clusters of `cluster`; called once and
    checked: the weights' words like `checked_read`, and in every program one warp per slice together read every word
    of `act`. Returns (call, bytes of `words` read)."""
    steps = words.numel() // (programs * 32 * 128)
    out = torch.full((2 * programs * 1024,), -1, device=words.device, dtype=torch.int32)
    row_bytes = act.shape[1] * 2 if act is not None else 0
    if act is not None and act.shape[1] != MCAST_SLICES * steps * 64:
        raise ValueError(f"act must be [16, {MCAST_SLICES * steps * 64}] for {steps} steps, got {list(act.shape)}")
    args = (words, words if act is None else act, out, steps, act is not None, mcast_init_ptx(steps, row_bytes, shared),
            mcast_step_ptx(steps, row_bytes, shared), MCAST_FINI_PTX)
    call = cluster_call(mcast_words, programs, cluster, args, num_warps=32)
    call()
    read = programs * 32 * 128 * steps
    what = f"mcast_words ({programs} programs, clusters of {cluster}, activation {act is not None}, shared {shared})"
    check_prefix(out[:programs * 1024], words, read, what)
    if act is not None:
        seen = out[programs * 1024:].view(programs, MCAST_SLICES, 4, 32)[:, :, 0]
        want = xor_all(act.view(torch.int32))
        if any(xor_all(seen[p]) != want for p in range(programs)):
            raise AssertionError(f"{what} missed activation words")
    return call, read * 4


def prefix_ms(checked, bufs, nbytes: int) -> float:
    """ms per call of a reader over each of `bufs` (`checked(buf)` returns its call and the bytes it reads: a
    prefix), scaled to `nbytes`."""
    from .__main__ import time_ms

    calls, read = zip(*(checked(b) for b in bufs))
    return time_ms(lambda: [c() for c in calls], True) / len(bufs) * nbytes / read[0]


# (warps per program, programs per SM) of the one-wave grids `ring_sweep` times: 16, 32 and 64 warps per SM
RING_GRIDS = [(8, 2), (16, 1), (4, 8), (8, 4), (16, 2), (32, 1), (8, 8), (16, 4)]
SMEM_PER_SM = 200 * 1024  # what the programs of one SM may hold, so that they stay resident together


def ring_sweep(bufs, sms: int, nbytes: int) -> dict[str, float]:
    """ms per call (scaled to `nbytes`) of `read_words` and `ring_words` on each `RING_GRIDS` grid, one wave of
    programs each looping over its own contiguous run, for rings of 2 to 8 slots of 512 to 2048 bytes per warp."""
    from .__main__ import time_ms

    times = {}
    for warps, per_sm in RING_GRIDS:
        programs = sms * per_sm
        for loads in (1, 2):
            calls = [checked_read(b, warps, loads, programs) for b in bufs]
            label = f"{warps * per_sm} warps/SM ({per_sm} x {warps}), {loads} loads"
            times[label] = time_ms(lambda: [c() for c in calls], True) / len(bufs)
        for slots in (2, 4, 8):
            for chunk in (512, 1024, 2048):
                ring = warps * slots * chunk
                if ring + 8 * warps * slots > 48 * 1024 or ring * per_sm > SMEM_PER_SM:
                    continue
                label = f"{warps * per_sm} warps/SM ({per_sm} x {warps}), ring {slots} x {chunk} B"
                times[label] = prefix_ms(lambda b: checked_ring_read(b, warps, slots, chunk, programs), bufs, nbytes)
    return times


GROUPED_GRIDS = [(32, 1), (8, 4), (16, 4), (4, 16)]  # (warps per program, programs per SM)


def activation_sweep(bufs, sms: int, nbytes: int, act_bytes: int = 16 * 8192 * 2) -> dict[str, float]:
    """ms per call (scaled to `nbytes`) of `grouped_words` with one run per warp and 512 B per step, and 0, 1 or 2
    blocks of 512 B per warp and step read from one `act_bytes` buffer that every program reads (the M = 16
    activation: 16 x 8192 bf16), on one-wave grids of 32 and 64 warps per SM: what an L2 stream beside the weights'
    DRAM stream costs."""
    act = torch.randint(-2**31, 2**31 - 1, (act_bytes // 4,), device=bufs[0].device, dtype=torch.int32)
    times = {}
    for warps, per_sm in [(32, 1), (16, 2), (16, 4)]:
        for act_loads in (0, 1, 2):
            label = f"{warps * per_sm} warps/SM ({per_sm} x {warps}), {act_loads} x 512 B of L2 per 512 B"
            times[label] = prefix_ms(lambda b: checked_grouped_read(b, warps, 1, 1, sms * per_sm, act, act_loads),
                                     bufs, nbytes)
    return times


def multicast_sweep(bufs, sms: int, nbytes: int, programs: int = 128) -> dict[str, float]:
    """ms per call (scaled to `nbytes`) of `mcast_words` on `programs` programs of 32 warps (the M = 16 slice plan's
    grid at 8192^2): the weights alone, and with the activation's windows through either ring in clusters of 1 and 2
    CTAs; beside `grouped_words` on the same grid with 0, 512, 256 and 128 B of plain L2 loads per 512 B of weights."""
    steps = bufs[0].numel() // (programs * 32 * 128)
    act = torch.randn(16, MCAST_SLICES * steps * 64, device=bufs[0].device, dtype=torch.bfloat16)
    times = {}
    for act_loads, vec in ((0, 4), (1, 4), (1, 2), (1, 1)):
        times[f"{programs} x 32 warps, plain loads, {act_loads * vec * 128} B of L2 per 512 B"] = prefix_ms(
            lambda b: checked_grouped_read(b, 32, 1, 1, programs, act.view(torch.int32).reshape(-1), act_loads, vec),
            bufs, nbytes)
    times[f"{programs} x 32 warps, mcast_words, weights only"] = prefix_ms(
        lambda b: checked_mcast_read(b, None, programs, 1), bufs, nbytes)
    for shared in (False, True):
        for cluster in (1, 2):
            times[f"{programs} x 32 warps, mcast_words, {'one ring' if shared else 'ring per slice'}, clusters of "
                  f"{cluster}"] = prefix_ms(lambda b: checked_mcast_read(b, act, programs, cluster, shared), bufs, nbytes)
    return times


def grouped_sweep(bufs, sms: int, nbytes: int, grids=GROUPED_GRIDS, every_run: bool = True) -> dict[str, float]:
    """ms per call (scaled to `nbytes`) of `grouped_words` on one-wave grids of 32 and 64 warps per SM: runs per warp,
    per 2 or 4 warps and per program, 512 B to 2 KB per warp and step (without `every_run`: runs per warp, 512 B)."""
    times = {}
    for warps, per_sm in grids:
        for group in sorted({1, 2, 4, warps}) if every_run else (1,):
            for loads in (1, 2, 4) if every_run else (1,):
                label = f"{warps * per_sm} warps/SM ({per_sm} x {warps}), group {group}, {loads} x 512 B"
                times[label] = prefix_ms(lambda b: checked_grouped_read(b, warps, group, loads, sms * per_sm), bufs,
                                         nbytes)
    return times


def main(argv=None):
    from .__main__ import cold_copies, time_ms

    p = argparse.ArgumentParser(prog="python -m bench.read_floor", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["8192x8192:nvfp4", "8192x8192:mxfp4", "10240x8192:nvfp4",
                                                    "8192x8192:mxfp8"], help="NxK:format of the weights")
    p.add_argument("--ring", action="store_true",
                   help="time `ring_words` against `read_words` on one-wave grids of 16, 32 and 64 warps per SM instead")
    p.add_argument("--activation", action="store_true",
                   help="time `grouped_words` with reads of an L2-resident buffer beside the weights' instead")
    p.add_argument("--multicast", action="store_true",
                   help="time `mcast_words` (the activation multicast in thread-block clusters) instead")
    p.add_argument("--grouped", nargs="?", const="all", default=None,
                   help="time `grouped_words` (per-warp runs, runs shared by groups of warps) on one-wave grids instead; "
                        "WARPSxPER_SM: on that grid only, one run per warp, 512 B per step")
    args = p.parse_args(argv)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"# {torch.cuda.get_device_name()}, {sms} SMs; python -m bench.read_floor", flush=True)
    for shape in args.shapes:
        nk, fmt = shape.split(":")
        n, k = map(int, nk.split("x"))
        x = torch.randn(16, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        cublas = {m: time_ms(lambda m=m: torch.nn.functional.linear(x[:m], w), True) for m in (1, 16)}
        del w
        nbytes = int(operand_bytes(fmt, n, k))
        copies = cold_copies(nbytes, 8)
        bufs = [torch.randint(-2**31, 2**31 - 1, (nbytes // 4,), device="cuda", dtype=torch.int32) for _ in range(copies)]
        dst = [torch.empty_like(b) for b in bufs]
        # the copy moves twice the bytes: its TB/s below count the weight bytes once, as for the reads
        times = {"d2d copy (reads and writes)": time_ms(lambda: [d.copy_(s) for d, s in zip(dst, bufs)], True) / copies}
        del dst
        for warps in () if args.ring or args.grouped or args.activation or args.multicast else (4, 8, 16):
            for loads in (1, 2):
                wave = sms * 64 // warps  # programs resident at 64 warps per SM
                for waves in (0.25, 1, None):
                    programs = round(wave * waves) if waves else None
                    calls = [checked_read(b, warps, loads, programs) for b in bufs]
                    label = f"{warps} warps, {loads} loads, " + (f"{waves} wave" if waves else "one step per program")
                    times[label] = time_ms(lambda: [c() for c in calls], True) / copies
        if args.ring:
            times.update(ring_sweep(bufs, sms, nbytes))
        if args.activation:
            times.update(activation_sweep(bufs, sms, nbytes))
        if args.multicast:
            times.update(multicast_sweep(bufs, sms, nbytes))
        if args.grouped:
            every_run = args.grouped == "all"
            grids = GROUPED_GRIDS if every_run else [tuple(map(int, args.grouped.split("x")))]
            times.update(grouped_sweep(bufs, sms, nbytes, grids, every_run))
        del bufs
        print(f"\n{n} x {k} {fmt}: {nbytes / 1e6:.1f} MB, {copies} copies; cuBLAS bf16 M = 1 {cublas[1] * 1e3:.1f} us, "
              f"M = 16 {cublas[16] * 1e3:.1f} us", flush=True)
        for label, ms in times.items():
            print(f"  {label:40s} {ms * 1e3:7.2f} us {nbytes / ms / 1e9:5.2f} TB/s   x cuBLAS bf16 M = 1 "
                  f"{cublas[1] / ms:.2f}, M = 16 {cublas[16] / ms:.2f}", flush=True)


if __name__ == "__main__":
    main()
