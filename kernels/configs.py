"""Default Helion configs per (device arch, backend, pair, M bucket), read from JSON data.

Nothing autotunes at call time; `python -m bench.sweep` prints tuned entries for these files.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

import helion

_DIR = Path(__file__).parent / "configs"

# Settings of every @helion.kernel here. Helion computes autotuner seed configs each time it
# binds a new specialization (static shapes: one per M, N, K); on the H100 machine that took
# 8-10 s of a 30 s bench cell (cProfile, 2026-11-22), yet our configs come from the tables
# below and never use those seeds. HELION_DISABLE_AUTOTUNER_HEURISTICS=0 turns them back on
# for autotuning the kernels with Helion's own autotuner: when it is set, Helion reads it.
KERNEL_SETTINGS = dict(
    static_shapes=True,
    **({} if "HELION_DISABLE_AUTOTUNER_HEURISTICS" in os.environ else {"disable_autotuner_heuristics": True}),
)


def arch_key(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    if torch.version.hip is not None:
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm{major}{minor}"


@functools.lru_cache(maxsize=None)
def _table(arch: str) -> dict:
    path = _DIR / f"{arch}.json"
    if not path.exists():
        path = _DIR / "generic.json"
    return json.loads(path.read_text())


def table_entry(backend: str, pair: str, m: int, k: int, arch: str) -> dict:
    """The first entry of the arch's table for `backend` whose filters match: each entry may
    name `pairs` and bound `max_m` / `min_k`; its "config" holds the Helion config fields."""
    for entry in _table(arch).get(backend, []):
        if "pairs" in entry and pair not in entry["pairs"]:
            continue
        if m > entry.get("max_m", m) or k < entry.get("min_k", 0):
            continue
        return entry
    raise LookupError(f"no default config for backend {backend!r}, pair {pair!r}, M={m} on {arch}")


def default_config(backend: str, pair: str, m: int, n: int, k: int, arch: str) -> helion.Config:
    """The Helion config of `table_entry`."""
    return entry_config(table_entry(backend, pair, m, k, arch))


def entry_config(entry: dict) -> helion.Config:
    """The Helion config of one table entry (one shared object per distinct config)."""
    return _as_config(tuple(sorted((key, _freeze(v)) for key, v in entry["config"].items())))


def _freeze(v):
    return tuple(v) if isinstance(v, list) else v


@functools.lru_cache(maxsize=None)
def _as_config(items: tuple) -> helion.Config:
    return helion.Config(**{k: list(v) if isinstance(v, tuple) else v for k, v in items})


@functools.lru_cache(maxsize=None)
def _with_k_groups(cfg: helion.Config, groups: int) -> helion.Config:
    sizes = list(cfg.config["block_sizes"])
    sizes[-1] = groups
    return helion.Config(**{**cfg.config, "block_sizes": sizes})


def with_min_k_groups(cfg: helion.Config, groups: int) -> helion.Config:
    """`cfg` with its K-group block size (the last block size) raised to at least `groups`."""
    if cfg.config["block_sizes"][-1] >= groups:
        return cfg
    return _with_k_groups(cfg, groups)
