"""The parts of bench/ that need no GPU and no TritonBench: CLI, byte counts, the
TritonBench glue against a stand-in of TritonBench's operator API."""

import json
import sys
import time
import types

import pytest
import torch

import blockscaled as bs
from bench import __main__ as cli
from bench import tritonbench as tb_runner
from bench.providers import FORMAT_PAIRS, LLAMA_8B, LLAMA_70B, operand_bytes
from blockscaled.kernels import plans
from blockscaled.kernels.plans import MMA_PAIRS

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the read kernels: Triton on the GPU, its interpreter on a CPU


def test_format_choices_cover_every_pair():
    assert sorted(FORMAT_PAIRS.values()) == sorted(bs.SUPPORTED_PAIRS)


def test_operand_bytes_are_the_storage_bits():
    assert operand_bytes("nvfp4", 8192, 8192) == 8192 * 8192 * 4.5 / 8
    assert operand_bytes("mxfp4", 1, 32) == 17  # 16 bytes of nibbles + one scale
    assert operand_bytes("mxfp8", 1, 32) == 33
    assert operand_bytes("bf16", 2, 8) == 32


def test_shapes_from_arguments():
    args = cli.parse_args(["--K_range", "256", "1024", "--K_step", "256", "-M", "1", "4", "-N", "512"])
    assert cli.shapes(args, on_gpu=True) == [(m, 512, k) for k in (256, 512, 768, 1024) for m in (1, 4)]
    args = cli.parse_args(["--llama", "-M", "16"])
    assert cli.shapes(args, on_gpu=True) == [(16, n, k) for n, k in LLAMA_70B]
    args = cli.parse_args(["--llama", "8b", "-M", "1", "16"])
    assert cli.shapes(args, on_gpu=True) == [(m, n, k) for n, k in LLAMA_8B for m in (1, 16)]
    assert (4096, 14336) in LLAMA_8B and (57344, 8192) in LLAMA_70B
    with pytest.raises(SystemExit):
        cli.parse_args(["--llama", "7b"])


def test_cli_validates_on_cpu_and_records_nothing(capsys):
    assert cli.main(["--format", "w8a16-mxfp8", "nvfp4", "-M", "2", "--no-record"]) == 0
    out = capsys.readouterr().out
    assert "validate bf16xmxfp8" in out and "validate nvfp4xnvfp4" in out and "timings need a GPU" in out
    assert "validate mxfp4xmxfp4" not in out


def test_precompile_runs_cells_in_processes_and_reports_failures(capsys):
    """--jobs: every cell is run once in a worker process; a cell that raises is named with
    the error (K=48 is not a whole number of mxfp4 blocks), the others pass silently."""
    from bench.providers import compile_cell

    cli.precompile(compile_cell, [(("bf16", "mxfp4"), 1, 32, k, torch.float32, "cpu") for k in (64, 48)], jobs=2)
    out = capsys.readouterr().out
    assert "precompiled 2 cells" in out
    failures = [line for line in out.splitlines() if line.startswith("precompile ")]
    assert len(failures) == 1 and "bf16xmxfp4 M=1 N=32 K=48" in failures[0] and "K" in failures[0]


@pytest.mark.parametrize("warps,loads,programs", [(4, 1, 3), (4, 2, None), (8, 1, 1)])
def test_read_floor_reads_every_word_once(warps, loads, programs):
    """The read_weights yardstick covers every word exactly once (the programs' xors give the xor of all; a
    flipped word or a program that skipped its last step would not), on looping and one-step grids, with a tail."""
    from bench.read_floor import checked_read, read_launcher, weight_words, xor_all

    words = torch.randint(-2**31, 2**31 - 1, (5000,), dtype=torch.int32, device=DEVICE)
    checked_read(words, warps, loads, programs)
    call, out = read_launcher(words, warps, loads, programs or 1)
    call()
    words[4999] ^= 1 << 7  # the last word lies in the tail past the last full step
    assert xor_all(out) != xor_all(words)
    b = bs.quantize(torch.randn(32, 64), "nvfp4")
    assert weight_words(b).numel() * 4 == operand_bytes("nvfp4", 32, 64)


@pytest.mark.parametrize("warps,group,loads,act_loads,act_vec", [(4, 1, 1, 0, 4), (4, 2, 2, 1, 2), (4, 4, 1, 2, 1),
                                                                  (4, 1, 1, 1, 4)])
def test_grouped_read_covers_its_prefix_once(warps, group, loads, act_loads, act_vec):
    """`grouped_words` (read_floor --grouped / --activation / --multicast) reads the longest prefix its grid splits
    evenly, each word once, whatever the group and the L2-resident reads beside it (`checked_grouped_read` raises
    otherwise)."""
    from bench.read_floor import checked_grouped_read

    words = torch.randint(-2**31, 2**31 - 1, (5000,), dtype=torch.int32, device=DEVICE)
    act = torch.randint(-2**31, 2**31 - 1, (1024,), dtype=torch.int32, device=DEVICE)
    _, nbytes = checked_grouped_read(words, warps, group, loads, 2, act, act_loads, act_vec)
    assert nbytes == 4 * (5000 // (2 * warps * loads * 128)) * 2 * warps * loads * 128


@pytest.mark.gpu
@pytest.mark.parametrize("cluster", [1, 2])
@pytest.mark.parametrize("shared", [False, True], ids=["ring_per_slice", "one_ring"])
def test_mcast_read_delivers_every_window(cluster, shared):
    """`mcast_words` (read_floor --multicast) on 4 programs, launched in clusters of `cluster`: the weights' prefix
    read once, and in every program one warp per K slice read every word of the activation through the multicast ring
    (`checked_mcast_read` raises otherwise); an activation of the wrong width is refused."""
    from bench.read_floor import MCAST_SLICES, checked_mcast_read

    steps = 3  # odd: the last step's slot is the first one's again, in the other phase
    words = torch.randint(-2**31, 2**31 - 1, (4 * 32 * 128 * steps + 77,), dtype=torch.int32, device="cuda")
    act = torch.randn(16, MCAST_SLICES * steps * 64, dtype=torch.bfloat16, device="cuda")
    _, nbytes = checked_mcast_read(words, act, 4, cluster, shared)
    assert nbytes == 4 * 4 * 32 * 128 * steps
    with pytest.raises(ValueError, match="act must be"):
        checked_mcast_read(words, act[:, :-64], 4, cluster, shared)


def test_providers_option():
    assert cli.parse_args([]).providers == list(cli.PROVIDERS)
    assert cli.parse_args(["--providers", "blockscaled_k_order", "cublas_bf16"]).providers == ["blockscaled_k_order", "cublas_bf16"]
    with pytest.raises(SystemExit):
        cli.parse_args(["--providers", "cutlass"])


def test_commit_label_prefers_the_environment(monkeypatch):
    """A copied tree may carry a stale .git: BLOCKSCALED_COMMIT, when set, labels the rows."""
    monkeypatch.setenv("BLOCKSCALED_COMMIT", "abc1234")
    assert cli.git_commit() == "abc1234"
    monkeypatch.delenv("BLOCKSCALED_COMMIT")
    assert cli.git_commit() not in ("abc1234", "")


def test_plot_from_csv_draws_one_commits_rows(tmp_path, monkeypatch):
    """A run split over several commands is drawn from its rows in the CSV, one commit only."""
    fields = cli.COLUMNS + cli.EXTRA_COLUMNS
    rows = [dict.fromkeys(fields, "") | dict(commit=c, gpu="H100", pair="mxfp4xmxfp4", M=m, N=64, K=64, provider=p,
                                           median_ms="0.01", speedup_vs_bf16=str(x))
            for c, x in (("old", 0.5), ("new", 1.5)) for m in (1, 16) for p in ("blockscaled", "cublas_bf16")]
    path = tmp_path / "h100.csv"
    with path.open("w", newline="") as f:
        wr = cli.csv.DictWriter(f, fieldnames=fields)
        wr.writeheader()
        wr.writerows(rows)
    drawn = []
    monkeypatch.setattr(cli, "plot", lambda rows, png: drawn.append((rows, png)))
    assert cli.main(["--plot", str(path)]) == 0
    (got, png), = drawn
    assert png == tmp_path / "h100_new.png"
    assert {r["commit"] for r in got} == {"new"} and sorted({r["M"] for r in got}) == [1, 16]
    with pytest.raises(SystemExit, match="no rows of commit absent"):
        cli.main(["--plot", str(path), "--commit", "absent"])
    monkeypatch.undo()
    assert cli.main(["--plot", str(path), "--commit", "old"]) == 0
    assert (tmp_path / "h100_old.png").stat().st_size > 0


def test_csv_rows_name_this_project_blockscaled_with_the_weights_layout(tmp_path):
    """DESIGN.md section 5: this project's rows read provider "blockscaled" whatever layout its weights take; the
    layout they had goes to `weights_layout` (the device's default for `blockscaled`; empty for baselines); the rows
    with the activation quantized in the call (issue #60) read "blockscaled_dynamic"."""
    assert set(cli.OURS_LAYOUT) == {p for p in cli.PROVIDERS if p.startswith("blockscaled")}
    rows = [dict.fromkeys(cli.COLUMNS, "1") | dict(timing="cudagraph", plain_ms="1") | cli.csv_provider(p)
            for p in cli.PROVIDERS]
    cli.record(rows, "NVIDIA H100 80GB HBM3", tmp_path)
    with (tmp_path / "h100.csv").open(newline="") as f:
        raw = f.read()
        f.seek(0)
        got = list(cli.csv.DictReader(f))
    assert "\r" not in raw and raw.splitlines()[0] == ",".join(cli.COLUMNS + cli.EXTRA_COLUMNS)
    assert [(r["provider"], r["weights_layout"]) for r in got] == [
        ("blockscaled", "k_order"), ("blockscaled", "k_order"), ("blockscaled_dynamic", "k_order"),
        ("blockscaled_mma_plan", "k_order"), ("blockscaled_dense", "k_order"), *[(p, "") for p in cli.PROVIDERS[5:]]]
    assert [cli.provider_label(r) for r in got[:6]] == ["blockscaled[k_order]", "blockscaled[k_order]",
                                                        "blockscaled_dynamic[k_order]", "blockscaled_mma_plan[k_order]",
                                                        "blockscaled_dense[k_order]", "cublas_bf16"]
    old = tmp_path / "old" / "h100.csv"
    old.parent.mkdir()
    old.write_text(",".join(cli.COLUMNS + ["timing", "plain_ms"]) + "\n")
    with pytest.raises(SystemExit, match="migrate the file first"):
        cli.record(rows, "NVIDIA H100 80GB HBM3", old.parent)


def test_committed_results_follow_the_design_columns():
    """Every committed results CSV parses to rows of exactly the recorded columns, with this project's rows as
    provider "blockscaled" (or "blockscaled_dynamic") and a weights layout; the quantize kernel's rows
    (`<gpu>_quantize.csv`, `bench.quantize`) with frac_of_copy_bw; the model's (`<gpu>_model.csv`, `bench.model`)
    with a bf16 row for every quantized one."""
    from bench import model as bench_model, quantize as bench_quantize

    for path in sorted(cli.RESULTS.glob("*.csv")):
        with path.open(newline="") as f:
            rows = list(cli.csv.DictReader(f))
        assert rows, path
        if path.name.endswith("_model.csv"):
            for r in rows:
                assert list(r) == bench_model.FIELDS and None not in r.values(), (path, r)
                assert any(o["variant"] == "bf16" and o["commit"] == r["commit"] and o["batch"] == r["batch"]
                           for o in rows), (path, r)
                assert r["variant"] == "bf16" or float(r["kernel_sqnr_db"]) > 30, (path, r)
            continue
        quantize_rows = path.name.endswith("_quantize.csv")
        for r in rows:
            columns = bench_quantize.FIELDS if quantize_rows else cli.COLUMNS + cli.EXTRA_COLUMNS
            assert list(r) == columns and None not in r.values(), (path, r)
            if quantize_rows:
                assert r["pair"].startswith("quantize_") and 0 < float(r["frac_of_copy_bw"]) < 1.5, (path, r)
                continue
            assert r["provider"] not in ("blockscaled_pairs", "blockscaled_mma"), (path, r)
            ours = r["provider"] == "blockscaled" or r["provider"] in cli.FORCED_OR_DYNAMIC
            assert ours == bool(r["weights_layout"]), (path, r)


def test_quantize_kernel_compiles_for_sm90(capfd, tmp_path):
    """Every variant of the quantize kernel through Triton's sm_90 compiler, no GPU needed (`bench.quantize
    --compile-sm90`): a branch Helion emits that the GPU cannot compile fails here, not on the machine. 12 variants
    (3 formats x bf16 / fp32 in x codes / decoded rows), nvfp4's two with the amax reduced in every program, its four
    with the grid barrier (two kinds), mxfp8's two with the hardware's E4M3 conversion (one F2FP per two elements),
    `quantize_blocks_kernel` for each format (codes and decoded rows), both kernels with the dependents' early
    launch (PDL), and the bf16 pairs (mxfp4's codes and decoded rows, mxfp8's decoded rows: two elements an
    instruction, under half the instructions of the same rows one element at a time; nvfp4's codes, opt-in, over f16
    pairs rounded to odd)."""
    from bench import quantize as bench_quantize

    assert bench_quantize.main(["--compile-sm90", str(tmp_path)]) == 0
    lines = [ln for ln in capfd.readouterr().out.splitlines() if "compiled for sm_90" in ln]
    assert len(lines) == 34 and all(" 0 spilled," in ln for ln in lines), lines
    nvfp4_pairs = (tmp_path / "quantize_nvfp4_bfloat16_codes_pairs_pdl.ptx").read_text()
    assert "cvt.rz.f16x2.f32" in nvfp4_pairs and "add.rn.f16x2" in nvfp4_pairs  # the f16 pairs ran, not the blocks
    for variant in ("_own_amax ", "_barrier ", "_barrier_slots ", "_hw_e4m3 "):
        assert sum(variant in ln for ln in lines) == 2, (variant, lines)
    assert sum("_blocks " in ln for ln in lines) == 6, lines
    for ptx in tmp_path.glob("*.ptx"):  # the early launch where asked for, and only there
        assert ("griddepcontrol.launch_dependents" in ptx.read_text()) == ptx.stem.endswith("_pdl"), ptx.name
    for fmt in ("mxfp4", "mxfp8"):  # each block in one thread: no shuffle, no exchange through shared memory
        blocks = (tmp_path / f"quantize_{fmt}_bfloat16_codes_blocks.sass").read_text()
        assert "SHFL" not in blocks and "BAR.SYNC" not in blocks and "STS" not in blocks, fmt
    count = {ln.split()[0]: int(ln.split()[-2]) for ln in lines}
    for fmt in ("mxfp4", "mxfp8"):
        ptx = (tmp_path / f"quantize_{fmt}_bfloat16_decoded_pairs_pdl.ptx").read_text()
        assert "add.rn.bf16x2" in ptx and "mul.rn.bf16x2" in ptx and "max.u16x2" in ptx and "div" not in ptx, fmt
        assert count[f"quantize_{fmt}_bfloat16_decoded_pairs_pdl"] < count[f"quantize_{fmt}_bfloat16_decoded_blocks"] / 2
    assert count["quantize_mxfp4_bfloat16_codes_pairs_pdl"] < count["quantize_mxfp4_bfloat16_codes_blocks"]
    assert count["quantize_nvfp4_bfloat16_codes_pairs_pdl"] < count["quantize_nvfp4_bfloat16_codes_blocks"]
    sass = (tmp_path / "quantize_mxfp8_bfloat16_codes_hw_e4m3.sass").read_text()
    assert sass.count("F2FP.SATFINITE.E4M3.F32.PACK_AB") == 16, "32 elements a thread: 16 conversions"


def test_dense_decode_kernel_compiles_for_sm90(capfd, tmp_path):
    """Every variant of the dense plan's decode kernel through Triton's sm_90 compiler, no GPU needed."""
    from bench import dense as bench_dense

    assert bench_dense.main(["--compile-sm90", str(tmp_path)]) == 0
    lines = [ln for ln in capfd.readouterr().out.splitlines() if "compiled for sm_90" in ln]
    assert len(lines) == 6 and all(" 0 spilled," in ln for ln in lines), lines


def test_variants_shapes():
    from bench import variants

    assert variants.variant_shapes(variants.parse_args(["--llama"]), on_gpu=True) == LLAMA_70B
    assert variants.variant_shapes(variants.parse_args(["--llama", "8b"]), on_gpu=True) == LLAMA_8B
    assert variants.variant_shapes(variants.parse_args(["-N", "64", "-K", "128"]), on_gpu=True) == [(64, 128)]
    assert variants.variant_shapes(variants.parse_args([]), on_gpu=False) == [(32, 256)]
    with pytest.raises(SystemExit, match="--llama: .* need a GPU"):
        variants.variant_shapes(variants.parse_args(["--llama"]), on_gpu=False)


def sass_rows(out, pair):
    """bench.sass's printed rows of `pair`, each as {column: count} (the variant label before
    the counts may hold spaces)."""
    from bench import sass

    rows = [ln.split() for ln in out.splitlines() if ln.startswith(pair)]
    return [dict(zip(sass.COLUMNS, map(float, row[-len(sass.COLUMNS):]), strict=True)) for row in rows]


def test_sass_counts_the_mma_k_loop(capfd, tmp_path):
    """bench.sass --backend mma: per 64-K window and row group a thread runs 4 HMMA on its own
    registers, with no shared memory (every value stays in the thread that loaded it),
    unspilled; two row groups per warp share the activation loads."""
    from bench import sass

    argv = ["--backend", "mma", "--format", "w4a16-nvfp4", "-N", "256", "-K", "8192", "--variants",
            '[{"max_split": 1, "row_groups": 1}, {"max_split": 1, "row_groups": 2}]', "--keep", str(tmp_path)]
    assert sass.main(argv) == 0
    for row_groups, counts in zip((1, 2), sass_rows(capfd.readouterr().out, "bf16xnvfp4"), strict=True):
        assert counts["HMMA"] == 4 * row_groups and counts["HMUL2/HFMA2"] == 16 * row_groups
        assert counts["LDG"] >= 5 * row_groups + 4  # weight words and factors per group, 4 activation words
        assert counts["BAR"] == counts["STS"] == counts["LDS"] == 0
        assert counts["per_w"] < 3.5 and 0 < counts["regs"] <= 64 and counts["spill"] == 0


def test_mma_split_k_loop_loads_in_one_round_trip(capfd, tmp_path):
    """M = 1 with split-K across programs (k_warps 1): the window index is the program's, so the
    K loop's loads all leave before the first is used (one round trip per window) in 240
    (nvfp4 x nvfp4) and 100 (bf16 x mxfp4) instructions without the L2 eviction hints. A per-thread
    first window (as k_warps needs) cost 11 more and, for bf16, a second round trip (sm_90, 526ff11).
    The hints (the default) keep the one round trip; their cache policies cost instructions of their own."""
    from bench import sass

    argv = ["--backend", "mma", "--format", "nvfp4", "w4a16-mxfp4", "-M", "1", "-N", "8192", "-K", "8192",
            "--variants", '[{"max_split": 16, "evict": false}, {"max_split": 16}]', "--keep", str(tmp_path)]
    assert sass.main(argv) == 0
    out = capfd.readouterr().out
    for pair, most in (("nvfp4xnvfp4", 240), ("bf16xmxfp4", 100)):
        plain, hinted = sass_rows(out, pair)
        assert plain["rt"] == 1 and plain["instr"] <= most, (pair, plain)
        assert hinted["rt"] == 1, (pair, hinted)


def test_mma_preload_issues_every_load_before_the_first_mma(capfd, tmp_path):
    """"preload" at M = 1: every load of the warp's windows (7 at 4096 x 14336, split 32; 4 at 4096 x 4096 with 16 K
    warps) is issued before its first HMMA, so the warp waits for one round trip. Without the fence after the loads
    (`mma_gemv.preloaded_windows`) ptxas sank each window's loads to just before that window's mma (13 round trips)."""
    import re

    from bench import sass

    for n, k, variant in ((4096, 14336, {"preload": True}), (4096, 4096, {"preload": True, "hoist": True})):
        argv = ["--backend", "mma", "--format", "w4a16-nvfp4", "-M", "1", "-N", str(n), "-K", str(k),
                "--variants", json.dumps([variant]), "--keep", str(tmp_path)]
        assert sass.main(argv) == 0
        capfd.readouterr()
        code = sass.instructions((tmp_path / "w4a16_nvfp4_0.sass").read_text())
        mmas = [i for i, (op, _) in enumerate(code) if op.startswith("HMMA")]
        loads = [i for i, (op, _) in enumerate(code) if re.match(r"LDG\b", op)]
        assert len(mmas) == 4 * k // 64 // (32 if k == 14336 else 16), (n, k, len(mmas))
        assert len([i for i in loads if i < mmas[0]]) >= 9 * len(mmas) // 4, (n, k, loads, mmas[0])
        assert not [i for i in loads if mmas[0] < i < mmas[-1]], (n, k, loads, mmas)


def test_mma_split_k_epilogue_reads_its_sums_in_one_batch(capfd, tmp_path):
    """M = 16 with split-K: the last program reads its 8 (two row groups: 16) sums per thread
    back in one batch after the ticket, not one L2 round trip after another (17 before)."""
    from bench import sass

    argv = ["--backend", "mma", "--format", "w4a16-nvfp4", "-M", "16", "-N", "256", "-K", "8192", "--variants",
            '[{"max_split": 8, "row_groups": 2}]', "--keep", str(tmp_path)]
    assert sass.main(argv) == 0
    (counts,) = sass_rows(capfd.readouterr().out, "bf16xnvfp4")
    assert counts["ep_rt"] == 2
    assert (tmp_path / "w4a16_nvfp4_0.sass").read_text().count("ATOMG.E.ADD.F32") == 16


# (format, M, N, K): default plans of each kind. M = 1: staged B (nvfp4) and K warps (bf16 activations); M = 16: K
# slices (8192^2) and split-K in clusters with the workspace path beside them (10240 x 8192); M = 64: mma_m64_kernel,
# split-K in the workspace (8192^2) and in clusters (10240 x 8192)
PDL_PLANS = [("nvfp4", 1, 8192, 8192), ("w4a16-nvfp4", 1, 8192, 8192), ("mxfp8", 16, 8192, 8192),
             ("nvfp4", 16, 10240, 8192), ("w4a16-mxfp4", 64, 8192, 8192), ("mixed", 64, 10240, 8192)]


@pytest.mark.parametrize("fmt, m, n, k", PDL_PLANS)
def test_mma_waits_for_the_grid_before_any_memory(capfd, tmp_path, fmt, m, n, k):
    """With PDL (the default up to M = 16, `plans._mma_pdl_by_plan`) the mma kernels may start while the kernel before them runs: in their sm_90 SASS the one
    `griddepcontrol.wait` (ACQBULK) comes before every global load, store and atomic (the activation, bias, scales,
    workspace and tickets may come from that kernel), and `griddepcontrol.launch_dependents` (PREEXIT) after the
    last mma of the K loop; with "pdl" False neither is there. With "pdl_prefetch" (M <= 16; the default there, 2
    windows, 4 for fp8 weights at 8 < M <= 16) the L2 prefetches of the first windows' weights (CCTL.E.PF2: nothing returned)
    come before the wait and the loads still after it."""
    from bench import sass

    variants = [{}, {"pdl": False}, {"pdl_prefetch": 0}] if m <= 16 else [{"pdl": True}, {}]
    argv = ["--backend", "mma", "--format", fmt, "-M", str(m), "-N", str(n), "-K", str(k), "--variants",
            json.dumps(variants), "--keep", str(tmp_path)]
    assert sass.main(argv) == 0
    capfd.readouterr()
    name = fmt.replace("-", "_")
    default_prefetch = plans.MMA_PDL_PREFETCH[FORMAT_PAIRS[fmt][1] == "mxfp8", plans._mma_column_groups(m)] if m <= 16 else 0
    for i, variant in enumerate(variants):
        ops = [op for op, _ in sass.instructions((tmp_path / f"{name}_{i}.sass").read_text())]
        if variant.get("pdl", m <= 16) is False:
            assert "ACQBULK" not in ops and "PREEXIT" not in ops and "CCTL.E.PF2" not in ops
            continue
        memory = [i for i, op in enumerate(ops) if op.split(".")[0] in ("LDG", "STG", "ATOMG", "RED", "LDGSTS", "ATOM")]
        mma = [i for i, op in enumerate(ops) if op.startswith(("HMMA", "HGMMA"))]
        prefetches = [i for i, op in enumerate(ops) if op == "CCTL.E.PF2"]
        assert ops.count("ACQBULK") == 1 and ops.count("PREEXIT") == 1, (fmt, m, n, k, variant)
        assert memory and ops.index("ACQBULK") < memory[0], (fmt, m, n, k, variant, ops[:memory[0] + 1])
        assert mma and ops.index("PREEXIT") > mma[-1], (fmt, m, n, k, variant)
        windows = variant.get("pdl_prefetch", default_prefetch)  # one weight and one factor line each
        assert len(prefetches) in (2 * windows, 4 * windows), (fmt, m, n, k, variant, len(prefetches))  # 1 or 2 row groups
        assert all(i < ops.index("ACQBULK") for i in prefetches), (fmt, m, n, k, variant)

def mma_formats(narrow):
    """The bench formats the mma kernels run with fp4 / fp8 (`narrow`) or bf16 activations."""
    return [f for f, (a, b) in FORMAT_PAIRS.items() if bs.SUPPORTED_PAIRS[a, b] in MMA_PAIRS and (a != "bf16") == narrow]


def assert_programs_fit(pair, counts, programs, warps):
    """`programs` of `warps` warps fit on an sm_90 SM with bench.sass's `counts`: 65,536
    registers, allocated per warp in units of 256, and 228 KB of shared memory."""
    warp_registers = -(-int(counts["regs"]) * 32 // 256) * 256
    assert int(counts["spill"]) == 0 and 65536 // warp_registers // warps >= programs, (pair, counts)
    assert counts["smem"] * programs <= 228 * 1024, (pair, counts["smem"])


def test_mma_k_warps_registers_fit_the_wave_rule(capfd):
    """`plans._mma_k_warps` counts 64 // k_warps resident programs per SM (<= 32 registers): true
    for the sm_90 registers and shared memory of every bf16-activation pair at M = 1, N = K =
    8192, with every k_warps of `MMA_K_WARPS`."""
    from blockscaled.kernels.plans import MMA_K_WARPS

    from bench import sass

    formats = mma_formats(False)
    argv = ["--backend", "mma", "--format", *formats, "-M", "1", "-N", "8192", "-K", "8192",
            "--variants", json.dumps([{"k_warps": k} for k in MMA_K_WARPS])]
    assert sass.main(argv) == 0
    out = capfd.readouterr().out
    for pair in (bs.SUPPORTED_PAIRS[FORMAT_PAIRS[f]] for f in formats):
        for k_warps, counts in zip(MMA_K_WARPS, sass_rows(out, pair), strict=True):
            assert_programs_fit(pair, counts, 64 // k_warps, warps=k_warps)


def test_mma_staged_b_loads_the_first_window_early(capfd):
    """The M = 1 plan of fp4 / fp8 activations at N = K = 8192 (staged B, 16 K warps): its first window's 5 weight
    words are loaded before the loop with the activation's (`pre` >= 7; ptxas drops loads whose values nothing uses,
    and without them the staging's 2-3 loads are all), and its programs still fit 4 per SM (<= 32 registers)."""
    from bench import sass

    formats = mma_formats(True)
    assert sass.main(["--backend", "mma", "--format", *formats, "-M", "1", "-N", "8192", "-K", "8192"]) == 0
    out = capfd.readouterr().out
    for pair in (bs.SUPPORTED_PAIRS[FORMAT_PAIRS[f]] for f in formats):
        (counts,) = sass_rows(out, pair)
        assert counts["pre"] >= 7 and counts["LDS"] == 2, (pair, counts)  # LDS: B read from the staged buffer
        assert_programs_fit(pair, counts, 4, warps=16)


def test_mma_k_slices_registers_fit_the_wave_rule(capfd):
    """`plans._mma_k_slices` counts its `MMA_K_SLICES` resident programs per SM (2 of 4 slices x
    4 warps, 1 of 8 x 4): true for the sm_90 registers and shared memory of every plan it makes at
    M = 16, N = K = 8192 (4 slices of two row groups, 8 of one; fp4 weights one window ahead and two
    windows per K-loop iteration where the entry says so; bf16 x mxfp8 4 slices of one, `MMA_BF16_FP8_M16_SLICES`).
    M <= 8 takes fewer registers (sm_90, 8 slices with ahead: 48-50 at M = 8 against 51-56 at M = 16)."""
    from blockscaled.kernels.plans import MMA_BF16_FP8_M16_SLICES, MMA_K_SLICES

    from bench import sass

    formats = mma_formats(False) + mma_formats(True)
    # per entry: the plan of fp8 weights (no ahead, one window per iteration), and of fp4 weights where it differs
    plans = [(entry, tail) for entry in MMA_K_SLICES for tail in dict.fromkeys([(0, 1), tuple(entry[-2:])])]
    variants = [{"k_warps": e[0], "row_groups": e[1], "ahead": a, "unroll": u} for e, (a, u) in plans]
    argv = ["--backend", "mma", "--format", *formats, "-M", "16", "-N", "8192", "-K", "8192", "--variants", json.dumps(variants)]
    assert sass.main(argv) == 0
    out = capfd.readouterr().out
    for fmt in formats:
        a, b = FORMAT_PAIRS[fmt]
        pair = bs.SUPPORTED_PAIRS[a, b]
        fp4_weights = b != "mxfp8"
        for counts, ((slices, row_groups, resident, *_, ahead, unroll), tail) in zip(sass_rows(out, pair), plans, strict=True):
            if tail != ((ahead, unroll) if fp4_weights else (0, 1)):
                continue  # not a plan the rule makes
            assert_programs_fit(pair, counts, resident, warps=4 * slices)
    # bf16 on fp8 weights where the rule makes 8 slices of one row group: MMA_BF16_FP8_M16_SLICES, one program per SM
    slices, ahead, unroll = MMA_BF16_FP8_M16_SLICES
    variant = {"k_warps": slices, "row_groups": 1, "ahead": ahead, "unroll": unroll}
    argv = ["--backend", "mma", "--format", "w8a16-mxfp8", "-M", "16", "-N", "8192", "-K", "8192", "--variants",
            json.dumps([variant])]
    assert sass.main(argv) == 0
    counts, = sass_rows(capfd.readouterr().out, bs.SUPPORTED_PAIRS["bf16", "mxfp8"])
    assert_programs_fit("bf16 x mxfp8", counts, 1, warps=4 * slices)


@pytest.mark.parametrize("narrow", [False, True], ids=["bf16", "narrow"])
def test_mma_m64_registers_fit_the_wave_rule(capfd, narrow):
    """`MMA_M64_PROGRAMS_PER_SM` holds for mma_m64_kernel (8 warps) at M = 64, N = K = 8192,
    with wgmma (sm_90: 4 HGMMA m64n64k16 per window; 3 programs, 2 for fp4 / fp8 activations on fp4
    weights) and with mma.sync (32 HMMA: 8 column groups x 4 steps; 2): registers and shared memory
    (two 64-row B windows) of every pair."""
    from blockscaled.kernels.plans import MMA_M64_PROGRAMS_PER_SM

    from bench import sass

    formats = mma_formats(narrow)
    argv = ["--backend", "mma", "--format", *formats, "-M", "64", "-N", "8192", "-K", "8192", "--variants", '[{}, {"wgmma": false}]']
    assert sass.main(argv) == 0
    out = capfd.readouterr().out
    for pair in (bs.SUPPORTED_PAIRS[FORMAT_PAIRS[f]] for f in formats):
        wgmma, mma_sync = sass_rows(out, pair)
        assert (wgmma["HGMMA"], wgmma["HMMA"], mma_sync["HGMMA"], mma_sync["HMMA"]) == (4, 0, 0, 32), pair
        issue_bound = narrow and not pair.endswith("mxfp8")
        for kernel, counts in ((True, wgmma), (False, mma_sync)):
            assert_programs_fit(pair, counts, MMA_M64_PROGRAMS_PER_SM[kernel, issue_bound], warps=8)
        if pair == "mxfp8xmxfp4":
            # with the post-scales read before the loop (4053425) ptxas issued none of these loads ahead of the B
            # exchange's fence: M = 64, 8192^2 mxfp8 x mxfp4 36.0 -> 42.4 us (H100). mxfp8 x mxfp8 lost 41.1 -> 43.2 us
            # that way then, but its build with the fragment-order split-K sums issues none early either and ran 38.2
            # against 40.8-41.0 us with the scalar sums and one early load
            # (bench/results/h100_mma_m64_fragment_sums_ab_n8192_k8192_e79d0d2_2026-11-27.log): not a rule for it
            assert wgmma["early"] >= 1, pair


@pytest.mark.parametrize("narrow", [False, True], ids=["bf16", "narrow"])
def test_mma_tile_128_registers_fit_the_wave_rule(capfd, narrow):
    """`MMA_M64_TILE_128_PROGRAMS_PER_SM` holds for mma_m64_kernel's default at M = 128 (128 activation rows per
    program: 8 HGMMA m64n64k16 per window), N = K = 8192: registers and shared memory (two 128-row B windows)."""
    from blockscaled.kernels.plans import MMA_M64_TILE_128_PROGRAMS_PER_SM

    from bench import sass

    formats = mma_formats(narrow)
    argv = ["--backend", "mma", "--format", *formats, "-M", "128", "-N", "8192", "-K", "8192"]
    assert sass.main(argv) == 0
    out = capfd.readouterr().out
    for pair in (bs.SUPPORTED_PAIRS[FORMAT_PAIRS[f]] for f in formats):
        (counts,) = sass_rows(out, pair)
        assert (counts["HGMMA"], counts["HMMA"]) == (8, 0), pair
        assert_programs_fit(pair, counts, MMA_M64_TILE_128_PROGRAMS_PER_SM, warps=8)


def test_early_loads_stop_at_the_first_fence_or_barrier():
    from bench.sass import early_loads

    assert early_loads(["LDG.E", "IADD3", "LDG.E.64", "MEMBAR.ALL.CTA", "LDG.E", "BAR.SYNC"]) == 2
    assert early_loads(["STS", "BAR.SYNC.DEFER_BLOCKING", "LDG.E"]) == 0
    assert early_loads(["LDGSTS.E.128", "LDG.E"]) == 2  # no fence: every load of the loop


def test_serial_reads_counts_reads_that_wait_for_earlier_ones():
    from bench import sass

    def code(*lines):
        return sass.instructions("".join(f"/*{16 * i:04x}*/ {line} ;\n" for i, line in enumerate(lines)))

    batch = code("ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R9, desc[UR6][R4.64], RZ",
                 "LDG.E.64 R10, desc[UR6][R2.64]", "STG.E desc[UR6][R6.64], RZ", "FMUL R12, R9, R11")
    assert sass.serial_reads(batch) == 1  # a store does not wait; the FMUL comes after the last read
    chain = code("ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R9, desc[UR6][R4.64], RZ", "FMUL R9, R6, R9",
                 "LDG.E.64 R10, desc[UR6][R2.64]", "STG.E desc[UR6][R8.64], R11", "@P0 LDG.E R14, desc[UR6][R2.64+0x8]")
    assert sass.serial_reads(chain) == 3  # R9 is used before the LDG, R11 (the LDG's second word) before the last


def test_tritonbench_argv_defaults():
    assert tb_runner.build_argv(["--metrics", "latency"]) == [
        "--op", "blockscaled_gemm", "--metrics", "latency", "--rtol", "1.6e-2", "--atol", "1e-2"]
    assert tb_runner.build_argv(["--op", "x", "--rtol", "0.1", "--atol", "0.2"]) == ["--op", "x", "--rtol", "0.1", "--atol", "0.2"]


def test_tritonbench_needs_a_checkout(tmp_path):
    with pytest.raises(SystemExit, match="--tritonbench: path to a TritonBench checkout is required"):
        tb_runner.main([])
    with pytest.raises(SystemExit, match="is not a TritonBench checkout"):
        tb_runner.main(["--tritonbench", str(tmp_path)])


@pytest.fixture
def fake_tritonbench(monkeypatch):
    """A stand-in for tritonbench.utils.triton_op with the same names and call shapes.
    It checks our glue only; the real checkout is exercised on the GPU machine."""
    registered = {}

    class BenchmarkOperator:
        def __init__(self, tb_args, extra_args=None):
            # TritonBench reads the operator name from the module path
            assert self.__class__.__module__ == "tritonbench.operators.blockscaled_gemm"
            self.tb_args, self.extra_args, self.device = tb_args, extra_args, tb_args.device

    def register_benchmark(baseline=False, **kw):
        def deco(fn):
            registered[fn.__name__] = baseline
            return fn
        return deco

    def register_metric(**kw):
        return lambda fn: fn

    triton_op = types.ModuleType("tritonbench.utils.triton_op")
    triton_op.BenchmarkOperator = BenchmarkOperator
    triton_op.register_benchmark = register_benchmark
    triton_op.register_metric = register_metric
    pkgs = {name: types.ModuleType(name) for name in ("tritonbench", "tritonbench.utils", "tritonbench.operators")}
    for name, mod in {**pkgs, "tritonbench.utils.triton_op": triton_op}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "tritonbench.operators.blockscaled_gemm", raising=False)
    return registered


def test_operator_module_registers_and_runs(fake_tritonbench):
    module = tb_runner.load_operator_module()
    assert fake_tritonbench == {"cublas_bf16": True, "blockscaled": False, "blockscaled_dynamic": False,
                                "blockscaled_k_order": False, "blockscaled_dense": False}
    args = types.SimpleNamespace(device="cpu")
    op = module.Operator(args, ["--pair", "mxfp8xmxfp4", "-M", "3", "--n", "32", "--k", "64"])
    inputs = list(op.get_input_iter())
    assert len(inputs) == 1 and op.get_x_val(inputs[0]) == ("mxfp8xmxfp4", 3, 32, 64)
    got, base = op.blockscaled(*inputs[0])(), op.cublas_bf16(*inputs[0])()
    torch.testing.assert_close(got.float(), base.float(), rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(op.blockscaled_k_order(*inputs[0])().float(), got.float(), rtol=0, atol=0)
    # the activation quantized in the call: the same codes, so the same result bit for bit
    torch.testing.assert_close(op.blockscaled_dynamic(*inputs[0])().float(), got.float(), rtol=0, atol=0)
    torch.testing.assert_close(op.blockscaled_dense(*inputs[0])().float(), base.float(), rtol=1.6e-2, atol=1e-2)
    assert op.flops("blockscaled", inputs[0], None) == 2 * 3 * 32 * 64
    metrics = types.SimpleNamespace(latency=1.0)  # ms
    fn = op.blockscaled(*inputs[0])
    fn._name = "blockscaled"  # how TritonBench names the callable it passes to metrics
    assert op.gbps(fn, inputs[0], metrics) == pytest.approx((3 * 64 * 8.25 / 8 + 32 * 64 * 4.25 / 8 + 2 * 3 * 32) / 1e6)
    fn._name = "blockscaled_dynamic"  # the activation read in bf16
    assert op.gbps(fn, inputs[0], metrics) == pytest.approx((3 * 64 * 2 + 32 * 64 * 4.25 / 8 + 2 * 3 * 32) / 1e6)


def test_operator_takes_the_llama_shapes(fake_tritonbench, monkeypatch):
    """`--llama` runs the Llama-3-70B shapes, `--llama 8b` Llama-3-8B's (small stand-ins here: the inputs are made)."""
    module = tb_runner.load_operator_module()
    args = types.SimpleNamespace(device="cpu")
    assert module.LLAMA_SHAPES == {"70b": LLAMA_70B, "8b": LLAMA_8B}
    monkeypatch.setitem(module.LLAMA_SHAPES, "70b", [(32, 64)])
    monkeypatch.setitem(module.LLAMA_SHAPES, "8b", [(16, 128), (48, 64)])
    for extra, shapes in ((["--llama"], [(32, 64)]), (["--llama", "8b"], [(16, 128), (48, 64)]), ([], [(24, 96)])):
        op = module.Operator(args, ["--pair", "bf16xmxfp4", "-M", "1", "--n", "24", "--k", "96", *extra])
        assert [op.get_x_val(x)[2:] for x in op.get_input_iter()] == shapes


def test_operator_loader_is_patched(fake_tritonbench):
    ops = sys.modules["tritonbench.operators"]
    ops.load_opbench_by_name = lambda name: f"theirs:{name}"
    run_module = types.SimpleNamespace()
    tb_runner.register(run_module)
    assert run_module.load_opbench_by_name("gemm") == "theirs:gemm"
    assert run_module.load_opbench_by_name("blockscaled_gemm").__name__ == "Operator"


def test_operator_baseline_keeps_nvfp4_accuracy(fake_tritonbench):
    module = tb_runner.load_operator_module()
    op = module.Operator(types.SimpleNamespace(device="cpu"), ["--pair", "nvfp4xnvfp4", "-M", "5", "--n", "24", "--k", "64"])
    inputs = next(op.get_input_iter())
    torch.testing.assert_close(op.blockscaled(*inputs)().float(), op.cublas_bf16(*inputs)().float(), rtol=1.6e-2, atol=1e-2)
    # nvfp4's global scale computed in the call from the bf16 activation: the same codes and scale as the quantized one
    torch.testing.assert_close(op.blockscaled_dynamic(*inputs)().float(), op.blockscaled(*inputs)().float(), rtol=0, atol=0)


def test_precompile_holds_what_fits_in_free_gpu_memory(monkeypatch, capsys):
    """15 processes of 57344 x 8192 operands ran out of an 80 GB H100 (4 of 106496 x 16384 out of an H200's 140 GB at
    16 bytes a weight element): the items running at once hold at most 0.9 of the free memory (28 bytes a weight
    element and 512 MB each), a larger one runs alone, small ones run beside a large one, each item runs once, and
    a failing item is reported without stopping the others."""
    import concurrent.futures

    budget = int(0.9 * 80 * 10**9)
    need = {n * k: 28 * n * k + 2**29 for n, k in ((8192, 8192), (57344, 8192), (106496, 16384), (262144, 16384))}
    running, ran, peaks = [], [], []

    class Held:  # futures that finish one at a time, the oldest first, when precompile waits
        def __init__(self, max_workers, mp_context):
            self.workers = max_workers

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *item):
            assert len(running) < self.workers  # nothing queues behind busy processes
            fut = concurrent.futures.Future()
            running.append((fut, fn, item))
            peaks.append((len(running), sum(need[it[2] * it[3]] for _, _, it in running)))
            return fut

    def wait(futures, timeout, return_when):
        fut, fn, item = running.pop(0)
        try:
            fn(*item)
            fut.set_result(None)
        except Exception as e:  # noqa: BLE001 - the future carries it, as a process's would
            fut.set_exception(e)
        return {fut}, set(futures) - {fut}

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Held)
    monkeypatch.setattr(concurrent.futures, "wait", wait)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (80 * 10**9, 80 * 10**9))

    def compile_fn(pair, m, n, k, variant):
        ran.append((m, n, k))
        if m == 16:
            raise RuntimeError("no kernel")

    shapes = [(106496, 16384)] + [(8192, 8192)] * 6 + [(57344, 8192)] * 3 + [(262144, 16384)] + [(8192, 8192)] * 2
    work = [(("bf16", "mxfp4"), 16 if i == 3 else 1, n, k, {"backend": "mma"}) for i, (n, k) in enumerate(shapes)]
    cli.precompile(compile_fn, work, 15)
    assert sorted(ran) == sorted((m, n, k) for _, m, n, k, _ in work)
    assert all(total <= budget for count, total in peaks if count > 1)  # 262144 x 16384 (118 GB) ran alone
    assert max(count for count, _ in peaks) >= 7  # 106496 x 16384 (49 GB) beside the six small ones
    out = capsys.readouterr().out
    assert out.count("RuntimeError: no kernel") == 1 and 'M=16 N=8192 K=8192 {"backend": "mma"}' in out
    assert "precompiled 13 cells" in out and "with 15 processes" in out  # 0.9 * 80 GB holds 29 of the smallest


def test_precompile_drops_what_the_deadline_leaves(monkeypatch, capsys):
    """Past the deadline the items not started are dropped (a bounded autotune then times the cells it can); with no
    deadline, or an infinite one, everything compiles."""
    import concurrent.futures

    class NeverDone:  # futures that stay pending, as compiles queued behind busy processes
        def __init__(self, max_workers, mp_context):
            self.futures = []

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            self.futures.append(concurrent.futures.Future())
            return self.futures[-1]

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", NeverDone)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    work = [(("bf16", "nvfp4"), m, 8192, 8192) for m in (1, 2, 4)]
    cli.precompile(lambda *item: None, work, 3, deadline=time.time() - 1)
    out = capsys.readouterr().out
    assert "deadline reached, 3 items not started" in out and "precompiled 0 cells" in out
    ran = []
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", _inline_executor())
    for deadline in (None, float("inf")):
        cli.precompile(lambda *item: ran.append(item), work, 3, deadline=deadline)
    assert len(ran) == 6 and "precompiled 3 cells" in capsys.readouterr().out


def _inline_executor(started: dict | None = None):
    """A ProcessPoolExecutor stand-in running each item at submit (its processes' count into `started`)."""
    import concurrent.futures

    class Inline:
        def __init__(self, max_workers, mp_context):
            (started if started is not None else {})["workers"] = max_workers

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def submit(self, fn, *args):
            fut = concurrent.futures.Future()
            try:
                fut.set_result(fn(*args))
            except Exception as e:  # noqa: BLE001 - as a worker process would hand it back
                fut.set_exception(e)
            return fut

    return Inline


def test_layer_chain_orders_a_step_and_needs_a_gpu(monkeypatch):
    """bench.layer_chain: a step's calls layer by layer in the model's order; without a GPU it says so."""
    from bench import layer_chain

    shapes = LLAMA_8B
    order = layer_chain.step_order(shapes, 3)
    assert len(order) == 12 and order[:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert [shapes[s] for _, s in order[:4]] == [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        layer_chain.main(["--layers", "2"])
    # the flow on the CPU (interpreter) with each "graph" run once: every call made, PDL switched back
    ran = []
    monkeypatch.setattr(layer_chain, "graph_us", lambda calls: ran.append(len(calls)) or [c() for c in calls] and 1.0)
    assert layer_chain.main(["--device", "cpu", "--shapes", "32x64", "16x32", "--layers", "2", "--format",
                             "w4a16-mxfp4"]) == 0
    assert ran == [4, 2, 2] + [4, 2, 2] * 2 and plans.MMA_PDL
    # the PDL switch reaches plans made before it (their options are cached per shape)
    assert plans._default_mma_options(1, 4096, False, False).pdl is None  # on: the plan decides
    layer_chain.set_mma_pdl(False)
    try:
        assert plans._default_mma_options(1, 4096, False, False).pdl is False
    finally:
        layer_chain.set_mma_pdl(True)
    assert plans._default_mma_options(1, 4096, False, False).pdl is None
    from blockscaled.kernels import api

    assert set(plans.OPTION_CACHES) == {plans._default_mma_options, api._tuned_options_of}  # what the switch empties


def test_host_needs_a_gpu():
    """bench.host times host work around CUDA launches: without a GPU it says so instead of timing anything."""
    from bench import host

    if torch.cuda.is_available():
        pytest.skip("this checks the CPU message")
    with pytest.raises(SystemExit, match="needs a GPU"):
        host.main(["--format", "nvfp4", "-M", "1"])


def _gpu_tests_script():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("gpu_tests", Path(__file__).parents[1] / "scripts" / "gpu_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_tests_runner_sorts_every_outcome(tmp_path, monkeypatch):
    """scripts/gpu_tests.py on a stand-in suite: a pass, a failure, a skip and an unmarked test, in two shards and
    from an id file; every id gets its own process and its own line, and a skip counts against the run."""
    runner = _gpu_tests_script()
    (tmp_path / "test_standin.py").write_text(
        "import pytest\n"
        "@pytest.mark.gpu\ndef test_passes(): assert 1 + 1 == 2\n"
        "@pytest.mark.gpu\ndef test_fails(): assert 1 + 1 == 3\n"
        "@pytest.mark.gpu\ndef test_skips(): pytest.skip('no GPU here')\n"
        "def test_unmarked(): pass\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    monkeypatch.chdir(tmp_path)  # the runner runs from the suite's root, as from the repository's
    suite = "test_standin.py"
    ids = runner.collect([suite], "gpu")
    assert [i.split("::")[1] for i in ids] == ["test_passes", "test_fails", "test_skips"]
    logs = [tmp_path / f"shard{i}.log" for i in range(2)]
    assert [runner.main([suite, "--log", str(log), "--shard", str(i), "--shards", "2", "--jobs", "2"])
            for i, log in enumerate(logs)] == [1, 1]  # shard 0: the pass and the skip; shard 1: the failure
    lines = [line.split() for log in logs for line in log.read_text().splitlines() if line.split()[:1] in
             (["PASS"], ["FAIL"], ["SKIP"], ["NOTRUN"])]
    assert sorted((words[0], words[2].split("::")[1]) for words in lines) == [
        ("FAIL", "test_fails"), ("PASS", "test_passes"), ("SKIP", "test_skips")]
    assert "no GPU here" in logs[0].read_text()  # a skip's reason is logged
    passing = tmp_path / "ids.txt"
    passing.write_text(ids[0] + "\n")
    assert runner.main(["--log", str(tmp_path / "ids.log"), "--ids", str(passing)]) == 0
    assert runner.main(["--log", str(tmp_path / "late.log"), "--ids", str(passing), "--deadline", "-1"]) == 0
    assert (tmp_path / "late.log").read_text().splitlines()[1].startswith("NOTRUN")
    # --rerun: the ids a log did not pass (the summary line's counts are not ids), then the rest of that run
    old = tmp_path / "cut.log"
    old.write_text("# shard 0 of 1: 3 of 3 ids\n" + "".join(
        f"{status} {1.0:6.1f}s {suite}::{name}\n" for status, name in
        (("PASS", "test_passes"), ("NOTRUN", "test_skips"), ("FAIL", "test_fails"), ("NOTRUN", "test_passes")))
        + "# {'PASS': 1, 'NOTRUN': 2} in 9 s\n")
    assert runner.unpassed(str(old)) == [f"{suite}::test_skips", f"{suite}::test_fails", f"{suite}::test_passes"]
    assert runner.main(["--log", str(tmp_path / "rerun.log"), "--rerun", str(old)]) == 1  # the failure and the skip
    rerun = (tmp_path / "rerun.log").read_text()
    assert rerun.count("PASS ") == 1 and rerun.count("FAIL ") == 1 and rerun.count("SKIP ") == 1
    with pytest.raises(SystemExit):
        runner.main(["--log", str(tmp_path / "x.log"), "--shard", "2", "--shards", "2"])
    (tmp_path / "test_broken.py").write_text("import not_a_module_anywhere\n")
    with pytest.raises(SystemExit, match="could not collect"):  # not an empty, passing run
        runner.main(["test_broken.py", "--log", str(tmp_path / "broken.log")])
    assert runner.collect([suite], "not_a_marker") == []


def test_gpu_tests_classify_reads_the_summary_line():
    runner = _gpu_tests_script()
    assert runner.classify(0, ".\n1 passed in 0.10s\n") == "PASS"
    assert runner.classify(0, "s\nSKIPPED [1] t.py:3: no GPU\n1 skipped in 0.10s\n") == "SKIP"
    assert runner.classify(0, "1 passed, 1 skipped in 0.1s") == "SKIP"
    assert runner.classify(1, "F\n1 failed in 0.10s\n") == "FAIL"
    assert runner.classify(5, "no tests ran in 0.01s\n") == "FAIL"  # an id that no longer exists
    assert runner.classify(0, "") == "SKIP"  # nothing passed


def test_kernel_times_arguments_and_cpu_refusal():
    """`python -m bench.kernel_times`: formats, shape and variants parse; without a GPU it says it needs one."""
    from bench import kernel_times

    args = kernel_times.parse_args(["--format", "nvfp4", "w4a16-mxfp4", "-M", "32", "--variants", '[{}, {"split": 4}]'])
    assert (args.format, args.M, args.N, args.K, args.variants) == (["nvfp4", "w4a16-mxfp4"], 32, 8192, 8192,
                                                                     [{}, {"split": 4}])
    with pytest.raises(SystemExit, match="needs a CUDA GPU"):
        kernel_times.main(["--format", "nvfp4"])


def test_mid_m_probe_compiles_a_pipelined_wgmma_loop(capfd):
    """bench.mid_m compiles for sm_90 here: per 64 K, 4 wgmma of k16 fed by TMA copies in a ring (more copies than one
    iteration's two), no spills; its dot waits for the wgmma before the next decode (`wait_pendings` 0: the A
    operand is the decoded registers), the cost the GPU run measures."""
    from bench import mid_m

    variant = mid_m.DEFAULT_VARIANTS[1]
    assert mid_m.main(["--sass", "--variants", json.dumps([variant])]) == 0
    (counts,) = [json.loads(line) for line in capfd.readouterr().out.splitlines() if line.startswith("{")]
    assert counts["variant"] == variant
    assert counts["HGMMA"] == 4 and counts["wgmma"] == 4 and counts["tma_copy"] > 2 and counts["spill"] == 0
    assert "0" in counts["wait_pendings"]


def test_model_shapes_from_configs():
    """`--models`: each model's linears from its config (Llama-3's agree with the hand-written lists the records were
    made on), every shape once, in the bench CLI and bench.autotune; an unknown name is refused with the known ones."""
    from bench import autotune, providers
    from bench.__main__ import parse_args, shapes

    assert set(providers.MODEL_SHAPES["llama3-8b"]) == set(providers.LLAMA_8B)
    assert set(providers.MODEL_SHAPES["llama3-70b"]) == set(providers.LLAMA_70B)
    assert providers.MODEL_SHAPES["llama3-405b"][0] == (18432, 16384)  # (128 + 2 x 8) heads of 128
    assert (576, 7168) in providers.MODEL_SHAPES["deepseek-v3"]  # kv_a: 512 latent + 64 rope
    cells = shapes(parse_args(["-M", "1", "--models", "llama3-8b", "mixtral-8x7b"]), on_gpu=True)
    assert cells == [(1, n, k) for n, k in providers.MODEL_SHAPES["llama3-8b"]]  # Mixtral's experts: the same shapes
    assert autotune.cell_shapes(["8192x8192"], ["llama3-70b"]) == [(8192, 8192), (10240, 8192), (57344, 8192),
                                                                   (8192, 28672)]
    with pytest.raises(SystemExit, match="unknown \\['llama4'\\]; known: llama3-8b"):
        providers.model_shapes(["llama4"])


def test_targets_summarize_the_latest_row_of_each_cell(tmp_path, capsys):
    """`bench.targets` on a hand-made record of two shapes: the later row of a cell replaces the earlier, other
    layouts and plain-launch rows are ignored, the geometric mean and the floor are #62's, a shape without a row is
    named as missing."""
    import csv

    from bench import targets

    fields = ["date", "commit", "gpu", "pair", "M", "N", "K", "out_dtype", "provider", "median_ms", "speedup_vs_bf16",
              "timing", "weights_layout"]

    def row(commit, n, provider, ms, speedup, timing="cudagraph", layout="mma_m16k16"):
        return dict(date="2026-12-01", commit=commit, gpu="H", pair="bf16xnvfp4", M=1, N=n, K=4096, out_dtype="bfloat16",
                    provider=provider, median_ms=ms, speedup_vs_bf16=speedup, timing=timing,
                    weights_layout=layout if provider == "blockscaled" else "")

    rows = [row("old", 1024, "blockscaled", 0.004, 1.0), row("new", 1024, "blockscaled", 0.004, 2.0),
            row("new", 1024, "cublas_bf16", 0.008, 1.0), row("new", 1024, "blockscaled", 0.001, 9.0, layout="k_order"),
            row("new", 1024, "blockscaled", 0.001, 9.0, timing="plain"),
            row("new", 2048, "blockscaled", 0.010, 4.5), row("new", 2048, "cublas_bf16", 0.045, 1.0)]
    with (tmp_path / "x.csv").open("w") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    read = list(csv.DictReader((tmp_path / "x.csv").open()))
    (s,) = targets.summarize(read, [(1024, 4096), (2048, 4096), (512, 4096)], ["bf16xnvfp4", "bf16xmxfp8"], [1, 16])
    assert (s["pair"], s["m"], s["n"]) == ("bf16xnvfp4", 1, 2)
    assert abs(s["geomean"] - 3.0) < 1e-12  # sqrt(2 x 4.5)
    assert s["lo"] == ((1024, 4096), 2.0) and s["hi"] == ((2048, 4096), 4.5)
    assert s["under"] == []  # 2.0 < 2.2, but cuBLAS took 8 us there (< 20)
    assert s["missing"] == [(512, 4096)] and s["commits"] == ["new"] and not s["met"]
    rows[2]["median_ms"] = 0.02  # cuBLAS 20 us: the 2.0x cell is now under the floor
    (s,) = targets.summarize(rows, [(1024, 4096), (2048, 4096)], ["bf16xnvfp4"], [1])
    assert s["under"] == [((1024, 4096), 2.0)] and not s["met"]
    assert targets.weight_element("bf16xmxfp8") == "fp8" and targets.weight_element("mxfp8xmxfp4") == "fp4"
    assert targets.main(["--results", str(tmp_path), "--gpu", "x", "--models", "llama3-8b"]) == 0
    assert "bench/results" not in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--models: unknown"):
        targets.main(["--results", str(tmp_path), "--gpu", "x", "--models", "llama9"])
