"""Run GPU tests one pytest process per test id, several at a time: how the `bench/results/*_gpu_tests_*.log` files
are made on the GPU machine. Run it from the repository root:

    python3 scripts/gpu_tests.py --log LOG [--shard I --shards N] [--jobs P] [--deadline S] [--ids FILE | --rerun OLD_LOG]
                                 [PATH ...]

One process per id keeps one id's GPU memory and any crash from reaching the others, and lets a
command under the device's time limit run a shard of the ids (round robin over the collected order). Each id is
PASS (exit 0, passed, nothing skipped), SKIP (exit 0 with a skip: on a GPU machine a skip is a finding, so its reason
goes to the log), FAIL (any other exit) or NOTRUN (not started before --deadline seconds). The exit status is 1 when
any id failed or skipped. `--rerun OLD_LOG` runs the ids an earlier log did not pass (FAIL, SKIP, NOTRUN), as when a
call's time limit cut a run. Memory is shared: at 14 jobs the large tuned cells (57344 x 8192 with its fp64
reference, ~20 GB a process) filled an H200's 140 GB and one id failed out of memory; it passed alone. Read an
out-of-memory FAIL beside the jobs' sizes and rerun it with fewer jobs.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import re
import subprocess
import sys
import time


def output_tail(r: subprocess.CompletedProcess) -> str:
    """The end of a pytest process's output, for the log."""
    return r.stdout[-3000:] + r.stderr[-2000:]


def collect(paths: list[str], marker: str) -> list[str]:
    """The test ids pytest collects under `paths` with `-m marker`, in its order: relative to pytest's rootdir, so run
    from the repository root (or the directory of the suite's ini file), as `run_one` runs them."""
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", marker, *paths],
                       capture_output=True, text=True)
    if r.returncode not in (0, 5):  # 5: nothing selected; anything else is a collection error, not an empty suite
        raise SystemExit(f"pytest could not collect {paths} (exit {r.returncode}):\n{output_tail(r)}")
    return [line for line in r.stdout.splitlines() if "::" in line]


def classify(returncode: int, stdout: str) -> str:
    """PASS, SKIP or FAIL from one id's pytest exit status and its summary line."""
    summary = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    if returncode != 0:
        return "FAIL"
    return "SKIP" if "skipped" in summary or " passed" not in summary else "PASS"


def unpassed(log: str) -> list[str]:
    """The ids of a runner's log whose last line says FAIL, SKIP or NOTRUN, in the log's order (an id that passed on a
    later line is dropped)."""
    status: dict[str, str] = {}
    with open(log) as f:
        for line in f:
            m = re.match(r"(PASS|FAIL|SKIP|NOTRUN)\s+[\d.]+s\s+(\S+::\S+)\s*$", line)
            if m:
                status.pop(m.group(2), None)
                status[m.group(2)] = m.group(1)
    return [test_id for test_id, s in status.items() if s != "PASS"]


def run_one(test_id: str, start: float, deadline: float) -> tuple[str, str, float, str]:
    if time.time() - start > deadline:
        return test_id, "NOTRUN", 0.0, ""
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:logging", "-rs", test_id],
                       capture_output=True, text=True)
    return test_id, classify(r.returncode, r.stdout), time.time() - t0, output_tail(r)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/gpu_tests.py", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="*", default=["tests"])
    p.add_argument("--log", required=True, help="file the per-id lines are appended to")
    p.add_argument("--marker", default="gpu")
    p.add_argument("--shard", type=int, default=0)
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--jobs", type=int, default=8, help="pytest processes at a time")
    p.add_argument("--deadline", type=float, default=float("inf"), help="seconds after which no id starts")
    p.add_argument("--ids", help="file of test ids to run instead of the collected shard")
    p.add_argument("--rerun", metavar="OLD_LOG", help="run the ids this earlier log did not pass")
    args = p.parse_args(argv)
    if not 0 <= args.shard < args.shards:
        p.error(f"--shard must be in 0 .. --shards - 1, got {args.shard} of {args.shards}")
    if args.rerun:
        ids = unpassed(args.rerun)
        what = f"{len(ids)} ids not passed in {args.rerun}"
    elif args.ids:
        with open(args.ids) as f:
            ids = [line.strip() for line in f if line.strip()]
        what = f"{len(ids)} ids from {args.ids}"
    else:
        collected = collect(args.paths, args.marker)
        ids = collected[args.shard::args.shards]
        what = f"shard {args.shard} of {args.shards}: {len(ids)} of {len(collected)} ids of -m {args.marker}"
    counts: dict[str, int] = {}
    start = time.time()
    with open(args.log, "a") as log:
        print(f"# {what}, {args.jobs} at a time", file=log, flush=True)
        with cf.ThreadPoolExecutor(args.jobs) as ex:
            for fut in cf.as_completed([ex.submit(run_one, t, start, args.deadline) for t in ids]):
                test_id, status, seconds, text = fut.result()
                counts[status] = counts.get(status, 0) + 1
                print(f"{status} {seconds:6.1f}s {test_id}", file=log, flush=True)
                if status in ("FAIL", "SKIP"):
                    print(text, file=log, flush=True)
        print(f"# {counts} in {time.time() - start:.0f} s", file=log, flush=True)
    print(counts)
    return 1 if counts.get("FAIL") or counts.get("SKIP") else 0


if __name__ == "__main__":
    sys.exit(main())
