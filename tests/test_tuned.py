"""Tuned plans as data (`kernels/tuned.py`) and the command that writes them (`bench/autotune.py`), without a GPU:
the lookup rule for shapes off the table, the fallback where a shape refuses a neighbour's config, and a resumable,
bounded tuning run with a stand-in timer (the kernels themselves run through the interpreter and are checked)."""

import json

import pytest
import torch

import blockscaled as bs
from blockscaled.kernels import api, plans, tuned

ENTRIES = [
    dict(pair="bf16xnvfp4", m=1, n=8192, k=8192, config={"k_warps": 8}),
    dict(pair="bf16xnvfp4", m=16, n=8192, k=8192, config={"max_split": 4}),
    dict(pair="bf16xnvfp4", m=16, n=4096, k=14336, config=None),
    dict(pair="nvfp4xnvfp4", m=16, n=8192, k=8192, config={"split": 2}),
]


@pytest.fixture
def table_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(tuned, "TABLES", tmp_path)
    for cache in (tuned.table, tuned.config_for, api._tuned_options_of):
        cache.cache_clear()
    yield tmp_path
    for cache in (tuned.table, tuned.config_for, api._tuned_options_of):
        cache.cache_clear()


def test_gpu_key():
    assert tuned.gpu_key("NVIDIA H200") == "nvidia_h200" and tuned.gpu_key("NVIDIA H100 80GB HBM3") == "nvidia_h100_80gb_hbm3"


def test_nearest_takes_the_smallest_tuned_m_at_or_above_and_the_nearest_n_of_the_same_k_within_a_factor_2():
    pick = lambda *key: (tuned.nearest(ENTRIES, *key) or {}).get("config", "none")  # noqa: E731
    assert pick("bf16xnvfp4", 1, 8192, 8192) == {"k_warps": 8}
    assert pick("bf16xnvfp4", 4, 8192, 8192) == {"max_split": 4}  # M = 16's plan serves 4 rows
    assert pick("bf16xnvfp4", 16, 6144, 8192) == {"max_split": 4}  # 1.33x off in N
    assert pick("bf16xnvfp4", 16, 4096, 14336) is None  # tuned: the default plan was fastest
    assert pick("bf16xnvfp4", 16, 4096, 12288) == "none"  # no entry of this K: the rules, whatever N
    assert pick("bf16xnvfp4", 16, 8192, 4096) == "none"  # 8192 x 8192's entry is 2x off in K: not carried
    assert pick("bf16xnvfp4", 16, 1024, 8192) == "none"  # 4x off in N at the nearest: no neighbour
    assert pick("bf16xnvfp4", 64, 8192, 8192) == "none"  # nothing tuned at or above M = 64
    assert pick("mxfp4xmxfp4", 1, 8192, 8192) == "none"  # another pair's plans never carry over


def test_config_for_reads_the_gpus_file(table_dir):
    (table_dir / "nvidia_h200.json").write_text(json.dumps({"entries": ENTRIES}))
    assert tuned.config_for("nvidia_h200", "bf16xnvfp4", 1, 8192, 8192) == {"k_warps": 8}
    assert tuned.config_for("nvidia_h100_80gb_hbm3", "bf16xnvfp4", 1, 8192, 8192) is None  # no table: defaults


def test_a_config_the_shape_refuses_falls_back_to_the_default(table_dir):
    """An entry (a neighbour's, or a hand-edited one) with a split above this shape's K / 64, or a key refused at its
    M: the default plan, never an error."""
    (table_dir / "g.json").write_text(json.dumps({"entries": [
        dict(pair="nvfp4xnvfp4", m=16, n=512, k=128, config={"split": 3}),
        dict(pair="bf16xmxfp4", m=16, n=256, k=128, config={"wgmma": True}),  # refused at M <= 16
        dict(pair="bf16xnvfp4", m=16, n=512, k=128, config={"max_split": 2})]}))
    x = torch.randn(16, 128)
    for pair, (fa, fb) in (("nvfp4xnvfp4", ("nvfp4", "nvfp4")), ("bf16xmxfp4", ("bf16", "mxfp4"))):
        a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa)
        b = bs.quantize(torch.randn(256, 128), fb).with_data_layout("mma_m16k16")
        assert api._tuned_options("g", pair, a, b, 16, 256, 128) is None  # K = 128: split 3 > 2 windows
    b = bs.quantize(torch.randn(256, 128), "nvfp4").with_data_layout("mma_m16k16")
    options = api._tuned_options("g", "bf16xnvfp4", x.to(torch.bfloat16), b, 16, 256, 128)
    assert options == plans.mma_options_for({"max_split": 2}, x.to(torch.bfloat16), b, 16, 256)


def test_autotune_candidates_pass_the_checks_somewhere():
    """Every candidate is a config the mma backend takes at its M for a large shape (no dead grid points)."""
    from bench import autotune

    for m in (1, 8, 16, 64, 128, 256):
        x = torch.randn(m, 128)
        b = bs.quantize(torch.randn(256, 128), "nvfp4").with_data_layout("mma_m16k16")
        for config in autotune.candidates(m):
            plans.mma_options_for(config, x.to(torch.bfloat16), b, m, 8192)


def test_autotune_run_checks_times_writes_and_resumes(tmp_path, monkeypatch):
    """The loop with a stand-in for the mma kernels (they need a GPU): the product from the portable kernel, but
    wrong for one candidate, which must be dropped before timing; a stand-in timer makes split 2 the fastest."""
    from bench import autotune

    monkeypatch.setattr(autotune, "candidates", lambda m: [{"max_split": 2}, {"split": 10**6}, {"split": 2}, {"max_split": 4}])
    calls, timed = [], []

    poisoned = []

    def call(a, b, backend, config, out):
        assert backend == "mma" and out.dtype == torch.bfloat16
        poisoned.append(bool(out.isnan().all()))
        calls.append(config)
        bs.scaled_mm(a, b.with_data_layout("k_order"), out=out)
        return out.mul_(1.02) if config == {"max_split": 4} else out

    def measure(fn):
        fn()
        timed.append(calls[-1])
        return 0.010 if calls[-1] == {"split": 2} else 0.020

    path, log = tmp_path / "t.json", []
    entries = autotune.run([("bf16", "nvfp4")], [(128, 128)], [1], path, measure, device="cpu", log=log.append,
                           call=call)
    assert timed == [{}, {"max_split": 2}, {"split": 2}]  # split 10**6 refused unrun, max_split 4: wrong, untimed
    assert poisoned == [True, False, True, False, True, False, True]  # each checked call wrote a NaN-filled buffer
    assert any('{"max_split": 4}: max_rel_err' in line for line in log), log
    assert entries == json.loads(path.read_text())["entries"]
    (e,) = entries
    assert (e["pair"], e["m"], e["n"], e["k"]) == ("bf16xnvfp4", 1, 128, 128)
    assert e["config"] == {"split": 2} and e["us"] == 10.0 and e["default_us"] == 20.0
    autotune.run([("bf16", "nvfp4")], [(128, 128)], [1, 2], path, measure, device="cpu", log=log.append, call=call)
    assert len(timed) == 6  # M = 1 was in the table: only M = 2 ran
    autotune.run([("bf16", "nvfp4")], [(128, 128)], [4], path, measure, deadline=-1, device="cpu", log=log.append,
                 call=call)
    assert len(timed) == 6 and any("not started" in line for line in log)
    assert [e["m"] for e in json.loads(path.read_text())["entries"]] == [1, 2]
    warm = json.loads(path.read_text())  # an entry timed L2-warm (no "cold"): tuned again, replaced, not doubled
    del warm["entries"][0]["cold"]
    warm["entries"][0]["config"] = {"max_split": 2}
    path.write_text(json.dumps(warm))
    autotune.run([("bf16", "nvfp4")], [(128, 128)], [1, 2], path, measure, device="cpu", log=log.append, call=call)
    assert len(timed) == 9
    entries = json.loads(path.read_text())["entries"]
    assert [(e["m"], e["config"], e["cold"]) for e in entries] == [(1, {"split": 2}, True), (2, {"split": 2}, True)]


def test_committed_tables_hold_configs_the_backend_takes_at_their_shapes():
    """Every committed table (`kernels/tuned/*.json`): known pairs, one entry per cell, and each kept config one that
    `mma_options_for` accepts at the entry's M and N (a refused one would fall back to the rules without a word), a
    split within the entry's K, and faster than the default it was timed beside."""
    from bench.providers import FORMAT_PAIRS

    pairs = {api.SUPPORTED_PAIRS[p]: p for p in FORMAT_PAIRS.values()}
    paths = sorted(tuned.TABLES.glob("*.json"))
    assert paths, "no committed table"
    for path in paths:
        assert path.stem == tuned.gpu_key(path.stem), path
        entries = json.loads(path.read_text())["entries"]
        cells = [(e["pair"], e["m"], e["n"], e["k"]) for e in entries]
        assert len(cells) == len(set(cells)), path
        for e in entries:
            assert e["pair"] in pairs and e["pair"] in plans.MMA_PAIRS, e
            if e["config"] is None:
                continue
            fa, fb = pairs[e["pair"]]
            x = torch.randn(e["m"], 128)
            a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa)
            b = bs.quantize(torch.randn(256, 128), fb).with_data_layout("mma_m16k16")
            plans.mma_options_for(e["config"], a, b, e["m"], e["n"])
            assert e["config"].get("split", 1) <= e["k"] // 64 and e["us"] < e["default_us"], e
