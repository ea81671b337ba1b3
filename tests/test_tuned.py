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
    for clear in (tuned.clear_caches, api._tuned_options_of.cache_clear, api._tuned_gpu.cache_clear):
        clear()
    yield tmp_path
    for clear in (tuned.clear_caches, api._tuned_options_of.cache_clear, api._tuned_gpu.cache_clear):
        clear()


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


def test_nearest_takes_the_smallest_tuned_m_of_the_shapes_neighbours_not_of_the_table():
    """An M = 8 entry of another K does not hide this shape's M = 16 entry from 4 rows (M = 16's plan serves them,
    as before any M = 8 was tuned); at the same K, the smaller tuned M is taken before the nearer N."""
    entries = ENTRIES + [dict(pair="bf16xnvfp4", m=8, n=4096, k=4096, config={"k_warps": 16}),
                         dict(pair="bf16xnvfp4", m=8, n=10240, k=8192, config={"hoist": True})]
    pick = lambda *key: (tuned.nearest(entries, *key) or {}).get("config", "none")  # noqa: E731
    assert pick("bf16xnvfp4", 4, 4096, 14336) is None  # K = 14336's own M = 16 entry
    assert pick("bf16xnvfp4", 4, 4096, 4096) == {"k_warps": 16}
    assert pick("bf16xnvfp4", 4, 8192, 8192) == {"hoist": True}  # M = 8 at 1.25x off in N, before M = 16 at 8192
    assert pick("bf16xnvfp4", 12, 8192, 8192) == {"max_split": 4}  # 12 rows: M = 8's entries do not serve them
    assert pick("bf16xnvfp4", 4, 2048, 8192) == "none"  # 10240 is 5x off, 8192 4x: no neighbour at any M


def test_config_for_reads_the_gpus_file(table_dir):
    (table_dir / "nvidia_h200.json").write_text(json.dumps({"entries": ENTRIES}))
    assert tuned.config_for("nvidia_h200", "bf16xnvfp4", 1, 8192, 8192) == {"k_warps": 8}
    assert tuned.config_for("nvidia_h100_80gb_hbm3", "bf16xnvfp4", 1, 8192, 8192) is None  # no table: defaults


def test_a_rule_serves_the_shapes_no_entry_serves(table_dir):
    """A GPU's rule (`rules`) for a pair at M: taken where no entry of the same K is near in N, never over an entry
    (one whose config is None included), and for the M it names and fewer rows only."""
    entries = ENTRIES + [dict(pair="bf16xnvfp4", m=1, n=4096, k=4096, config=None)]
    rules = [dict(pair="bf16xnvfp4", m=1, config={"hoist": True}, shapes=[[5120, 5120, 7.9, 6.9]]),
             dict(pair="nvfp4xnvfp4", m=16, config={"evict": False}, shapes=[[5120, 5120, 9.0, 8.0]])]
    (table_dir / "g.json").write_text(json.dumps({"entries": entries, "rules": rules}))
    pick = lambda *key: tuned.config_for("g", *key)  # noqa: E731
    assert pick("bf16xnvfp4", 1, 8192, 8192) == {"k_warps": 8}  # the shape's entry
    assert pick("bf16xnvfp4", 1, 5120, 5120) == {"hoist": True}  # no entry of this K: the rule
    assert pick("bf16xnvfp4", 1, 1024, 8192) == {"hoist": True}  # an entry of this K, 8x off in N: the rule
    assert pick("bf16xnvfp4", 1, 4096, 4096) is None  # the entry's None (default fastest) stands
    assert pick("bf16xnvfp4", 2, 5120, 5120) is None  # no entry at M >= 2 of this K, and no rule at M >= 2
    assert pick("nvfp4xnvfp4", 4, 8192, 8192) == {"split": 2}  # an entry's config is carried to fewer rows
    assert pick("nvfp4xnvfp4", 4, 5120, 5120) == {"evict": False}  # M = 16's rule serves 4 rows
    assert pick("mxfp4xmxfp4", 1, 5120, 5120) is None  # another pair's rules never carry over
    (table_dir / "rules_only.json").write_text(json.dumps({"rules": rules}))
    assert pick("bf16xnvfp4", 1, 8192, 8192) == {"k_warps": 8} and tuned.config_for(
        "rules_only", "bf16xnvfp4", 1, 8192, 8192) == {"hoist": True}


def test_an_entrys_none_speaks_for_its_own_row_class_only(table_dir):
    """None ("the default plan was fastest") at M = 16 is the 9 .. 16 rows' default; 2 .. 8 rows have another
    default, so there a rule that serves them wins over the carried None. None at M = 8 stands for 2 .. 8 rows."""
    entries = [dict(pair="nvfp4xnvfp4", m=16, n=8192, k=8192, config=None),
               dict(pair="nvfp4xnvfp4", m=8, n=4096, k=4096, config=None),
               dict(pair="nvfp4xnvfp4", m=16, n=4096, k=4096, config={"row_groups": 1})]
    rules = [dict(pair="nvfp4xnvfp4", m=8, min_m=2, config={"max_split": 16}, shapes=[])]
    (table_dir / "c.json").write_text(json.dumps({"entries": entries, "rules": rules}))
    pick = lambda *key: tuned.config_for("c", *key)  # noqa: E731
    assert pick("nvfp4xnvfp4", 4, 8192, 8192) == {"max_split": 16}
    assert pick("nvfp4xnvfp4", 12, 8192, 8192) is None and pick("nvfp4xnvfp4", 16, 8192, 8192) is None
    assert pick("nvfp4xnvfp4", 1, 8192, 8192) is None  # no rule serves 1 row: the carried None, the default
    assert pick("nvfp4xnvfp4", 4, 4096, 4096) is None  # M = 8's own None
    assert pick("nvfp4xnvfp4", 12, 4096, 4096) == {"row_groups": 1}
    assert tuned.row_class(1) == 0 and tuned.row_class(2) == tuned.row_class(8) == 1
    assert tuned.row_class(9) == tuned.row_class(16) == 2 and tuned.row_class(17) == 3


def test_a_rule_serves_only_the_rows_and_sizes_it_names(table_dir):
    """A rule with "min_m" serves min_m .. m rows only, and with "min_weights" only N x K >= min_weights: fewer rows
    or smaller layers fall to the next rule that admits them, else to the default plan."""
    rules = [dict(pair="nvfp4xnvfp4", m=1, config={"hoist": True}, shapes=[]),
             dict(pair="nvfp4xnvfp4", m=16, min_m=9, min_weights=200_000_000, config={"predecode": True}, shapes=[]),
             dict(pair="mxfp4xmxfp4", m=16, min_weights=100, config={"max_split": 8}, shapes=[])]
    (table_dir / "sized.json").write_text(json.dumps({"rules": rules}))
    pick = lambda *key: tuned.config_for("sized", *key)  # noqa: E731
    assert pick("nvfp4xnvfp4", 16, 12288, 28672) == {"predecode": True}  # 352M weights
    assert pick("nvfp4xnvfp4", 9, 12288, 28672) == {"predecode": True}
    assert pick("nvfp4xnvfp4", 8, 12288, 28672) is None  # below min_m, and the M = 1 rule serves 1 row only
    assert pick("nvfp4xnvfp4", 1, 12288, 28672) == {"hoist": True}
    assert pick("nvfp4xnvfp4", 16, 5120, 27648) is None  # 141M weights
    assert pick("nvfp4xnvfp4", 17, 12288, 28672) is None  # above the rule's M
    assert pick("mxfp4xmxfp4", 1, 10, 10) == {"max_split": 8} and pick("mxfp4xmxfp4", 1, 9, 10) is None


def test_the_h200_rule_reaches_the_plan_of_an_untuned_shape():
    """On an H200 nvfp4 x nvfp4 at M = 1 hoists its L2 policies at a K no entry has (Qwen2.5's 5120), not at a tuned
    shape whose entry kept the default (8192^2), through the same path as a call (`api._tuned_options_of`)."""
    api._tuned_options_of.cache_clear()
    hoisted = api._tuned_options_of("nvidia_h200", "nvfp4xnvfp4", 1, 5120, 5120, True, False, True)
    assert hoisted is not None and hoisted.hoist and hoisted.evict
    assert api._tuned_options_of("nvidia_h200", "nvfp4xnvfp4", 1, 8192, 8192, True, False, True) is None
    assert api._tuned_options_of("nvidia_h200", "bf16xnvfp4", 1, 5120, 5120, False, False, True) is None


def test_an_entry_serves_only_the_rows_it_names(table_dir):
    """An entry with "min_m" serves min_m .. m rows: fewer fall past it (to an entry of another N that serves them,
    the rules, or the default plan), as the H200's predecode entries at M = 16 leave M <= 8 to the default."""
    entries = [dict(pair="nvfp4xnvfp4", m=16, min_m=9, n=57344, k=8192, config={"predecode": True}),
               dict(pair="nvfp4xnvfp4", m=16, n=40000, k=8192, config={"max_split": 8})]
    (table_dir / "e.json").write_text(json.dumps({"entries": entries}))
    pick = lambda *key: tuned.config_for("e", *key)  # noqa: E731
    assert pick("nvfp4xnvfp4", 16, 57344, 8192) == pick("nvfp4xnvfp4", 9, 57344, 8192) == {"predecode": True}
    assert pick("nvfp4xnvfp4", 8, 57344, 8192) == {"max_split": 8}  # the next nearest N that serves 8 rows


def test_the_h200_predecode_rule_serves_large_untuned_layers_at_m16():
    """On an H200 nvfp4 x nvfp4 at 9 .. 16 rows predecodes its activation on a layer of >= 2e8 weights of a K that no
    entry holds (Llama-3-405B's 16384 x 16384, 2.7e8), not on a smaller one, nor at 8 rows or fewer."""
    assert not [e for e in tuned.table("nvidia_h200")
                if e["pair"] == "nvfp4xnvfp4" and e["k"] in (16384, 6144)]  # what makes them untuned
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 16, 16384, 16384) == {"predecode": True}
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 9, 16384, 16384) == {"predecode": True}
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 8, 16384, 16384) == {"max_split": 16}  # 2 .. 8 rows' rule
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 16, 6144, 6144) is None  # 38M weights
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 16, 5120, 27648) is None  # its own entry: the default
    # the tuned entries alike: predecode at 9 .. 16 rows, the default below
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 16, 57344, 8192) == {"predecode": True}
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 4, 57344, 8192) == {"max_split": 16}  # 2 .. 8 rows' rule


def test_the_h200_rule_for_two_to_eight_rows():
    """On an H200 nvfp4 x nvfp4 at 2 .. 8 rows splits K at most 16 ways where no entry serves the shape (the default
    64 parts ran 1.4-2.2x slower at the three K = 4096 shapes timed); 1 row keeps its own rule, 9 .. 16 theirs."""
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 2, 12288, 28672) == {"max_split": 16}  # Mistral-Large
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 8, 12288, 28672) == {"max_split": 16}
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 1, 12288, 28672) == {"hoist": True}
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 9, 12288, 28672) == {"predecode": True}
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 4, 6144, 4096) == {"max_split": 16}  # its entry
    # 8192^2's M = 16 entry (None: M = 16's default fastest) does not speak for 2 .. 8 rows' default: the rule
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 4, 8192, 8192) == {"max_split": 16}
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 16, 8192, 8192) is None
    assert tuned.config_for("nvidia_h200", "nvfp4xnvfp4", 4, 5120, 5120) == {"row_groups": 1}  # M = 16's, carried
    assert tuned.config_for("nvidia_h200", "bf16xnvfp4", 4, 12288, 28672) is None  # no rule for bf16 activations


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
            if config.get("stage_b") or config.get("predecode"):  # fp4 / fp8 activations only
                plans.mma_options_for(config, bs.quantize(x, "nvfp4"), b, m, 8192)
            else:
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
    assert 'bf16xnvfp4 M=1 128x128 all (us): {"split": 2} 10.00; {"max_split": 2} 20.00' in log, log  # fastest first
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
    autotune.run([("bf16", "nvfp4")], [(128, 128)], [1, 2], path, measure, device="cpu", log=log.append, call=call,
                 retune=True)  # both cells again, replaced in place
    assert len(timed) == 15 and [e["m"] for e in json.loads(path.read_text())["entries"]] == [1, 2]


def test_committed_tables_hold_configs_the_backend_takes_at_their_shapes():
    """Every committed table (`kernels/tuned/*.json`): known pairs, one entry per cell, and each kept config one that
    `mma_options_for` accepts at the entry's M and N (a refused one would fall back to the rules without a word), a
    split within the entry's K, and faster than the default it was timed beside."""
    from bench.providers import FORMAT_PAIRS

    pairs = {api.SUPPORTED_PAIRS[p]: p for p in FORMAT_PAIRS.values()}

    def takes(pair: str, config: dict, m: int, n: int) -> None:  # `mma_options_for` accepts it (or raises)
        fa, fb = pairs[pair]
        x = torch.randn(m, 128)
        a = x.to(torch.bfloat16) if fa == "bf16" else bs.quantize(x, fa)
        b = bs.quantize(torch.randn(256, 128), fb).with_data_layout("mma_m16k16")
        plans.mma_options_for(config, a, b, m, n)

    paths = sorted(tuned.TABLES.glob("*.json"))
    assert paths, "no committed table"
    for path in paths:
        assert path.stem == tuned.gpu_key(path.stem), path
        data = json.loads(path.read_text())
        entries = data["entries"]
        cells = [(e["pair"], e["m"], e["n"], e["k"]) for e in entries]
        assert len(cells) == len(set(cells)), path
        for e in entries:
            assert e["pair"] in pairs and e["pair"] in plans.MMA_PAIRS, e
            if e["config"] is None:
                continue
            assert 1 <= e.get("min_m", 1) <= e["m"], e
            takes(e["pair"], e["config"], e["m"], e["n"])
            assert e["config"].get("split", 1) <= e["k"] // 64 and e["us"] < e["default_us"], e
        for r in data.get("rules", []):  # faster than the default at every shape it names, each one it serves
            takes(r["pair"], r["config"], r["m"], 256)
            assert r["pair"] in plans.MMA_PAIRS and len(r["shapes"]) >= 3 and 1 <= r.get("min_m", 1) <= r["m"], r
            assert all(us < default_us and n * k >= r.get("min_weights", 0) for n, k, default_us, us in r["shapes"]), r


QUANTIZE_ENTRIES = [
    dict(kernel="quantize_blocks_kernel", format="mxfp4", decoded=True, dtype="bfloat16", rows=16, k=8192,
         config={"block_sizes": [1, 64], "num_warps": 2}),
    dict(kernel="quantize_blocks_kernel", format="mxfp4", decoded=True, dtype="bfloat16", rows=2048, k=8192,
         config={"block_sizes": [16, 32], "num_warps": 8}),
    dict(kernel="quantize_blocks_kernel", format="mxfp4", decoded=False, dtype="bfloat16", rows=2048, k=8192,
         config=None),
]


def test_quantize_config_for_takes_the_smallest_tuned_rows_at_or_above_of_the_same_k(table_dir):
    (table_dir / "g.json").write_text(json.dumps({"entries": ENTRIES, "quantize": QUANTIZE_ENTRIES}))
    pick = lambda *key: tuned.quantize_config_for("g", "quantize_blocks_kernel", "mxfp4", *key)  # noqa: E731
    assert pick(True, "bfloat16", 1, 8192) == {"block_sizes": [1, 64], "num_warps": 2}
    assert pick(True, "bfloat16", 17, 8192) == {"block_sizes": [16, 32], "num_warps": 8}
    assert pick(True, "bfloat16", 8192, 8192) == {"block_sizes": [16, 32], "num_warps": 8}  # above all: the largest
    assert pick(False, "bfloat16", 2048, 8192) is None  # tuned: the default was fastest
    assert pick(True, "bfloat16", 16, 4096) is None  # another K: the default
    assert pick(True, "float32", 16, 8192) is None  # another input dtype
    assert tuned.quantize_config_for("g", "quantize_blocks_kernel", "nvfp4", True, "bfloat16", 16, 8192) is None
    assert tuned.config_for("g", "bf16xnvfp4", 1, 8192, 8192) == {"k_warps": 8}  # the mma section beside it


def test_quantize_autotune_checks_times_and_writes_beside_the_mma_plans(table_dir, monkeypatch):
    """`bench.autotune --quantize`'s loop on the interpreter, Helion's search stood in for (it needs a GPU): the
    captured launch is the call's own, the config returned is checked bit for bit against the default's outputs and
    timed; a config whose outputs differ is refused; the mma section of the same file is kept."""
    import helion

    from bench import autotune
    from blockscaled.kernels import api as kapi
    from blockscaled.kernels import quantize as kq
    from helion.runtime.kernel import BoundKernel

    path = table_dir / "g.json"
    path.write_text(json.dumps({"entries": ENTRIES}))
    found = helion.Config(block_sizes=[2, 4], num_warps=4, num_stages=1)
    searched = []
    seen_settings = []

    def search(self, args, force=True):
        searched.append(self.kernel.name)
        seen_settings.append({k: getattr(self.settings, k) for k in ("autotune_seed_configs", "autotune_ignore_errors",
                                                                     "autotune_budget_seconds")})
        return found

    monkeypatch.setattr(BoundKernel, "autotune", search)
    timed = []

    def measure(fn):
        fn()
        timed.append(fn)
        return 0.004 if len(timed) % 2 == 0 else 0.005  # the tuned launch (timed second) 20% faster

    log = []
    entries = autotune.run_quantize(["mxfp4"], [True], [8], [256], path, measure, budget=1, device="cpu",
                                    log=log.append)
    (e,) = entries
    assert searched == ["quantize_blocks_kernel"] and len(timed) == 2
    (knobs,) = seen_settings  # seeded with the launch's own default config; failing candidates skipped
    assert knobs["autotune_seed_configs"] == [kq.quantize_blocks_config(bs.get_format("mxfp4"), 256 // 32)], knobs
    assert knobs["autotune_ignore_errors"] is True and knobs["autotune_budget_seconds"] == 1
    assert e["config"]["block_sizes"] == [2, 4] and (e["us"], e["default_us"]) == (4.0, 5.0), log
    data = json.loads(path.read_text())
    assert data["quantize"] == entries and data["entries"] == ENTRIES
    assert autotune.run_quantize(["mxfp4"], [True], [8], [256], path, measure, 1, device="cpu") == entries
    assert len(timed) == 2  # resumed: already in the table

    # Fewer rows than a tuned entry: the call itself would take that entry's config; the capture takes the default's
    # launch (it had failed here, the launch not seen, at mxfp4 1 x 8192 after a 16-row entry on the H200).
    monkeypatch.setattr(kq, "_tuned_gpu", lambda device: "g")
    monkeypatch.setattr(kq, "_LAUNCHES", {})
    (e4, _) = autotune.run_quantize(["mxfp4"], [True], [4], [256], path, measure, 1, device="cpu")
    assert (e4["rows"], e4["config"]["block_sizes"]) == (4, [2, 4]) and len(timed) == 4
    assert searched[-1] == "quantize_blocks_kernel"

    real = kapi._compile

    def wrong_when_tuned(kernel, args, cfg, device, *rest, **kw):
        launch = real(kernel, args, cfg, device, *rest, **kw)
        if cfg is not found:
            return launch
        return lambda *a: (launch(*a), a[5].view(torch.uint8).view(-1)[:1].fill_(0))  # decoded rows: one byte off

    monkeypatch.setattr(kapi, "_compile", wrong_when_tuned)
    (e,) = [e for e in autotune.run_quantize(["mxfp4"], [True], [8], [512], path, measure, 1, device="cpu",
                                             log=log.append) if e["k"] == 512]
    assert e["config"] is None and any("outputs differ" in line for line in log), log


def test_a_tuned_quantize_config_reaches_the_launch(table_dir, monkeypatch):
    """The table's config for a quantize launch is the one compiled (interpreter, the GPU's key stood in for), and the
    decoded rows stay the reference's; another shape keeps the default config."""
    from blockscaled.kernels import api as kapi
    from blockscaled.kernels import quantize as kq
    from blockscaled.reference import dequantize

    entry = dict(QUANTIZE_ENTRIES[0], rows=4, k=512, config={"block_sizes": [2, 4], "num_warps": 4, "num_stages": 1})
    (table_dir / "g.json").write_text(json.dumps({"entries": [], "quantize": [entry]}))
    monkeypatch.setattr(kq, "_tuned_gpu", lambda device: "g")
    monkeypatch.setattr(kq, "_LAUNCHES", {})
    used = []
    real = kapi._compile
    monkeypatch.setattr(kapi, "_compile", lambda kernel, args, cfg, device, *rest, **kw: used.append(dict(cfg.config))
                        or real(kernel, args, cfg, device, *rest, **kw))
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    rows, _ = kq.quantize_decoded(x, bs.get_format("mxfp4"), "floor", None)
    assert used == [entry["config"]]
    assert torch.equal(rows, dequantize(bs.quantize(x, "mxfp4", backend="reference"), torch.bfloat16))
    kq.quantize_decoded(x[:, :256].contiguous(), bs.get_format("mxfp4"), "floor", None)
    assert used[1]["block_sizes"] != [2, 4]  # K = 256: no entry, the default


def test_a_tuned_quantize_config_that_fails_warns_and_the_default_runs(table_dir, monkeypatch):
    """A hand-edited or stale table entry whose config Helion refuses: one warning naming the file, then the default
    config, the rows still the reference's (interpreter)."""
    from blockscaled.kernels import quantize as kq
    from blockscaled.reference import dequantize

    entry = dict(QUANTIZE_ENTRIES[0], rows=4, k=512, config={"block_sizes": [3, 5, 7], "num_warps": 4})
    (table_dir / "g.json").write_text(json.dumps({"entries": [], "quantize": [entry]}))
    monkeypatch.setattr(kq, "_tuned_gpu", lambda device: "g")
    monkeypatch.setattr(kq, "_LAUNCHES", {})
    x = torch.randn(4, 512, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with pytest.warns(UserWarning, match=r"kernels/tuned/g.json: the quantize_blocks_kernel config .* failed"):
        rows, _ = kq.quantize_decoded(x, bs.get_format("mxfp4"), "floor", None)
    assert torch.equal(rows, dequantize(bs.quantize(x, "mxfp4", backend="reference"), torch.bfloat16))

    # a config that compiles and then fails to launch: not kept; the next call takes the default's launch, silently
    from blockscaled.kernels import api as kapi

    entry["config"] = {"block_sizes": [2, 4], "num_warps": 4, "num_stages": 1}
    (table_dir / "g.json").write_text(json.dumps({"entries": [], "quantize": [entry]}))
    tuned.clear_caches()
    monkeypatch.setattr(kq, "_LAUNCHES", {})
    real = kapi._compile

    def failing_launch(kernel, args, cfg, *rest, **kw):
        launch = real(kernel, args, cfg, *rest, **kw)
        if cfg.config.get("block_sizes") != [2, 4]:
            return launch
        return lambda *a: (_ for _ in ()).throw(RuntimeError("launch failed"))

    monkeypatch.setattr(kapi, "_compile", failing_launch)
    with pytest.warns(UserWarning, match="RuntimeError: launch failed"):
        kq.quantize_decoded(x, bs.get_format("mxfp4"), "floor", None)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows, _ = kq.quantize_decoded(x, bs.get_format("mxfp4"), "floor", None)
    assert torch.equal(rows, dequantize(bs.quantize(x, "mxfp4", backend="reference"), torch.bfloat16))


def test_quantize_autotune_tunes_the_kernel_the_call_runs_now(table_dir, monkeypatch):
    """An entry of the kernel a format ran on before (`QUANTIZE_BLOCKS` changed since) does not stand for the kernel
    the call runs now: its launch is tuned and both entries are kept."""
    import helion

    from bench import autotune
    from helion.runtime.kernel import BoundKernel

    path = table_dir / "g.json"
    stale = dict(kernel="quantize_kernel", format="mxfp4", decoded=True, dtype="bfloat16", rows=8, k=256,
                 config=None, us=1.0, default_us=1.0)
    path.write_text(json.dumps({"entries": [], "quantize": [stale]}))
    found = helion.Config(block_sizes=[2, 4], num_warps=4, num_stages=1)
    monkeypatch.setattr(BoundKernel, "autotune", lambda self, args, force=True: found)
    entries = autotune.run_quantize(["mxfp4"], [True], [8], [256], path, lambda fn: (fn(), 0.005)[1], budget=1,
                                    device="cpu", log=lambda line: None)
    assert [e["kernel"] for e in entries] == ["quantize_blocks_kernel", "quantize_kernel"]
