"""Split-K without extra launches: the last program of each output tile writes it.

The SPLIT programs of one output tile add their fp32 partial sums into a workspace and
take a ticket (`add_part`); the program holding the last ticket reads the tile's sum,
leaves zeros in the workspace, stores the sum in the output dtype and resets the ticket
(`store_sum`). Workspace and tickets are zero before and after every call, so a call is
one kernel: no zero-fill of an accumulator before it, no cast kernel after it. Kernels
call these helpers as

    ticket = add_part(workspace, tickets, tile_m, tile_n, part_sum)
    if ticket == SPLIT - 1:
        store_sum(out, workspace, tickets, tile_m, tile_n, rows_mask)

(the `if` stays in the kernel body: Helion compiles data-dependent branches there only).
"""

from __future__ import annotations

import torch

import helion.language as hl


def add_part(workspace, tickets, tile_m, tile_n, part_sum):
    """Add one program's float32 partial sum of the tile; return its ticket (0 .. SPLIT-1)."""
    # Relaxed adds (fire-and-forget reductions at L2; acq_rel ones cost block_dot 10-13% at
    # M = 16 on the H100), then the CUTLASS semaphore pattern: a CTA barrier orders every
    # thread's adds before the one thread whose ticket add releases them.
    hl.atomic_add(workspace, [tile_m, tile_n], part_sum)
    hl.inline_triton("tl.debug_barrier()", args=(), output_like=None)
    return hl.atomic_add(tickets, [tile_m.id, tile_n.id], 1, sem="acq_rel")


def store_sum(out, workspace, tickets, tile_m, tile_n, rows_mask=None):
    """The last program of a tile: its sum into `out` (rows outside `rows_mask` skipped),
    zeros into the workspace and the ticket."""
    zeros = hl.zeros([tile_m, tile_n], dtype=torch.float32)
    # read through an atomic (at L2, where the parts were added); the Triton interpreter
    # has no float atomic_xchg, and no other program touches the tile any more
    total = hl.atomic_add(workspace, [tile_m, tile_n], zeros)  # ordered after the ticket's acquire
    hl.store(out, [tile_m, tile_n], total.to(out.dtype), extra_mask=rows_mask)
    hl.store(workspace, [tile_m, tile_n], zeros)
    hl.store(tickets, [tile_m.id, tile_n.id], 0)
