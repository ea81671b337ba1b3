"""Tuned plans of the mma kernels and Helion configs of the quantize kernels, as data: `kernels/tuned/<gpu>.json`,
written by `python -m bench.autotune` (`--quantize`: Helion's autotuner).

| field      | meaning                                                                                  |
|------------|------------------------------------------------------------------------------------------|
| file name  | the GPU model: `gpu_key(torch.cuda.get_device_name())`, e.g. `nvidia_h200.json`          |
| entries    | [{"pair", "m", "n", "k", "config", "us", "default_us"}]: `config` the fastest `scaled_mm`|
|            | config of the candidates timed (None: the default plan was fastest); times in us;        |
|            | optional "min_m": the fewest rows it serves (else 1)                                     |
| rules      | [{"pair", "m", "config", "shapes"}]: a config that ran faster than the default plan at   |
|            | every shape timed, `shapes` [[n, k, default_us, us], ...]: for the shapes with no entry  |
|            | (written by hand from the `bench.autotune` logs and `bench.variants` runs behind them);  |
|            | optional "min_m" (the fewest rows it serves, else 1) and "min_weights" (the smallest     |
|            | N x K it serves, else any): where it was timed to win                                    |
| quantize   | [{"kernel", "format", "decoded", "dtype", "rows", "k", "config", "us", "default_us"}]:   |
|            | `config` the Helion config (`helion.Config` fields) Helion's autotuner found for that    |
|            | kernel and input, None where it did not beat the module's default by the keep margin     |

Lookup (`config_for`), once per (GPU, pair, M, N, K):
- entries of the same GPU model and pair that serve M rows ("min_m"), of the same K and an N within a factor of 2
  (K decides the split and the warps a K; carried across K, a 14336 x 4096 entry of M = 16 ran 8192 x 8192
  nvfp4 x nvfp4 at 1.57x cuBLAS bf16 against the rules' 1.91x on an H200);
- of those, the ones at the smallest tuned M >= M (a plan tuned for M rows serves fewer: the M = 16 entry of a shape
  serves 2 .. 8 rows where that shape has no M = 2 .. 8 entry, even if other shapes have), and of these the nearest N;
- none of these: the config of the GPU's rule for the pair at the smallest M >= M it has (`rules`) among those whose
  "min_m" and "min_weights" admit the call, where the rule exists; an entry's None (the default plan was fastest at
  that shape) is not overridden by a rule, but for rows of another `row_class` than its M (the M = 16 default plan
  being fastest at 16 rows says nothing of the 2 .. 8 rows' default: there the rule, if one serves them);
- none of these: None, and the default plan (`plans._mma_options`'s rules). A config the shape refuses (say a split
  above K / 64) also falls back to the default, in `api._mma_launch`.
Quantize configs (`quantize_config_for`): the entry of the same kernel, format, output (codes or decoded rows),
input dtype and K, at the smallest tuned row count >= the call's (else the largest tuned); none: the module's
default config. Never for nvfp4's grid-barrier variant (its programs must all be resident: a config of more
programs could wait forever).
Nothing tunes at call time.
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

TABLES = Path(__file__).parent / "tuned"
MAX_SHAPE_RATIO = 2.0


def gpu_key(name: str) -> str:
    """The table's file stem for a device name: "NVIDIA H200" -> "nvidia_h200"."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


@functools.lru_cache(maxsize=None)
def _file(gpu: str) -> dict:
    path = TABLES / f"{gpu}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def table(gpu: str) -> tuple[dict, ...]:
    """The mma plans' entries of the GPU's table."""
    return tuple(_file(gpu).get("entries", ()))


def rules(gpu: str) -> tuple[dict, ...]:
    """The mma plans' rules of the GPU's table: for the shapes without an entry."""
    return tuple(_file(gpu).get("rules", ()))


def quantize_table(gpu: str) -> tuple[dict, ...]:
    """The quantize kernels' entries of the GPU's table."""
    return tuple(_file(gpu).get("quantize", ()))


def clear_caches() -> None:
    """Forget the tables read (after `TABLES` changes or a table is written)."""
    _file.cache_clear()
    config_for.cache_clear()
    quantize_config_for.cache_clear()


@functools.lru_cache(maxsize=4096)
def quantize_config_for(gpu: str, kernel: str, fmt: str, decoded: bool, dtype: str, rows: int, k: int) -> dict | None:
    """The tuned Helion config of a quantize kernel's call (see the module's docstring), or None for the default."""
    same = [e for e in quantize_table(gpu) if (e["kernel"], e["format"], e["decoded"], e["dtype"], e["k"])
            == (kernel, fmt, decoded, dtype, k)]
    if not same:
        return None
    above = [e for e in same if e["rows"] >= rows]
    entry = min(above, key=lambda e: e["rows"]) if above else max(same, key=lambda e: e["rows"])
    return dict(entry["config"]) if entry["config"] else None


def _serves(e: dict, pair: str, m: int) -> bool:
    """Whether an entry or rule `e` serves m rows of `pair`: "min_m" (else 1) .. its M."""
    return e["pair"] == pair and e.get("min_m", 1) <= m <= e["m"]


def nearest(entries, pair: str, m: int, n: int, k: int) -> dict | None:
    """The entry `config_for` takes for (pair, m, n, k) among `entries` (see the module's docstring), or None."""
    limit = math.log2(MAX_SHAPE_RATIO)
    near = [e for e in entries if _serves(e, pair, m) and e["k"] == k and abs(math.log2(e["n"] / n)) <= limit]
    if not near:
        return None
    m_tuned = min(e["m"] for e in near)
    return min((e for e in near if e["m"] == m_tuned), key=lambda e: abs(math.log2(e["n"] / n)))


def rule(rules_, pair: str, m: int, n: int, k: int) -> dict | None:
    """The rule `config_for` takes for (pair, m, n, k) among `rules_` where no entry serves the shape: the pair's at
    the smallest M >= m of those that serve m rows ("min_m") and n x k weights ("min_weights"), or None."""
    same = [r for r in rules_ if _serves(r, pair, m) and n * k >= r.get("min_weights", 0)]
    return min(same, key=lambda r: r["m"]) if same else None


def row_class(m: int) -> int:
    """Rows whose default plans share a structure (`plans._mma_options`): 1 row (K warps), 2 .. 8 (one column group
    of 8 activation rows), 9 .. 16 (two), more (mma_m64_kernel). An entry's None ("the default was fastest") speaks
    for the default of its own class only."""
    return 0 if m == 1 else 1 if m <= 8 else 2 if m <= 16 else 3


@functools.lru_cache(maxsize=4096)
def config_for(gpu: str, pair: str, m: int, n: int, k: int) -> dict | None:
    """The tuned config for one call's plan, or None for the default plan."""
    entry = nearest(table(gpu), pair, m, n, k)
    if entry is None or (not entry["config"] and row_class(entry["m"]) != row_class(m)):
        entry = rule(rules(gpu), pair, m, n, k) or entry
    return None if entry is None or not entry["config"] else dict(entry["config"])
