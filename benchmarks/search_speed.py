"""Search speed: layouts evaluated per second, wall time, linear cost, peak memory, whole command.

Run:  python benchmarks/search_speed.py [--repeat 5] [--quick]

Cases (each over the whole default space: tp, cp <= 16, pp with its uneven splits, dp, ep and
etp for MoE models, ZeRO 0-3, micro-batch size, recompute, SP, vpp) with each model's published
sequence length and global batch: the mixture-of-experts searches DeepSeek-V3 on 1,024 H100s
and Qwen3-235B-A22B on 256 H100s, Llama-3 405B on 256 GB200 NVL72 GPUs (64-GPU NVLink domains),
GPT-3 175B on 512 H100s; Llama-3 405B and Megatron 1T on 16,384 H100s; and the 1T model with a
GPU budget (--max-gpus 16384), the largest dense space, for the linearity check.

"layouts" = every layout of the grid: each is checked against the rules, the valid ones get
their memory, the fitting ones their step time (search.scan), so layouts/s = grid size /
search wall time. Times are the minimum over --repeat runs after one warm-up (the machine is
shared; the minimum is the least disturbed run), wall clock and CPU time (user + sys; on a
loaded machine the wall time includes waiting for a core, the CPU time does not). Peak memory:
tracemalloc (numpy reports its buffers to it) during one search, and the process's maximum
resident set size. The whole command is `plan3d search ... --top 1 --json`, a new process each
time (interpreter start, imports, catalogs, search, output), per case.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc

import numpy as np

from planner import catalog
from planner.search.grid import Grid
from planner.search.objective import usable_memory
from planner.search.options import SearchOptions
from planner.search.grid import build_grid
from planner.search.run import search
from planner.search.scan import scan
from planner.specs import TrainingSpec

# (model, GPUs, --max-gpus, hardware profile); --quick runs the first four
CASES = [("deepseek-v3", 1024, None, "dgx-h100"), ("qwen3-235b-a22b", 256, None, "dgx-h100"),
         ("llama3-405b", 256, None, "gb200-nvl72"), ("gpt3-175b", 512, None, "dgx-h100"),
         ("llama3-405b", 16384, None, "dgx-h100"), ("megatron-1t", 16384, None, "dgx-h100"),
         ("megatron-1t", None, 16384, "dgx-h100")]
QUICK = 4


def _best(fn, repeat: int) -> tuple[float, float]:
    """(min wall seconds, min CPU seconds of this process and its children) over ``repeat``."""
    fn()
    walls, cpus = [], []
    for _ in range(repeat):
        r0, c0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
        r1, c1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(sum(getattr(b, f) - getattr(a, f) for a, b in ((r0, r1), (c0, c1))
                        for f in ("ru_utime", "ru_stime")))
    return min(walls), min(cpus)


def _setup(name: str, hardware: str = "dgx-h100"):
    m = catalog.resolve_model(name)
    hw = catalog.resolve_hardware(hardware)
    tr = TrainingSpec(seq_length=m.training.seq_length,
                      global_batch_size=m.training.global_batch_size, tokens=m.training.tokens)
    return m, hw, tr


def _case_name(name: str, gpus: int | None, budget: int | None, hardware: str) -> str:
    on = f"{gpus:,}" if gpus else f"<= {budget:,}"
    return f"{name} on {on} {hardware}"


def _command(name: str, gpus: int | None, budget: int | None, hardware: str) -> list[str]:
    exe = shutil.which("plan3d") or os.path.join(os.path.dirname(sys.executable), "plan3d")
    count = ["-g", str(gpus)] if gpus else ["--max-gpus", str(budget)]
    return [exe, "search", "-m", name, *count, "--hardware", hardware, "--top", "1", "--json"]


def case_rows(repeat: int, cases: list[tuple]) -> list[dict]:
    rows = []
    for name, gpus, budget, hardware in cases:
        m, hw, tr = _setup(name, hardware)
        opts = SearchOptions(max_gpus=budget)
        grid = build_grid(m, hw, tr, gpus, opts)
        wall, cpu = _best(lambda: search(m, hw, tr, gpus, opts), repeat)
        tracemalloc.start()
        res = search(m, hw, tr, gpus, opts)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        cmd = _command(name, gpus, budget, hardware)
        whole, whole_cpu = _best(lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL),
                                 max(3, repeat // 2))
        rows.append(dict(case=_case_name(name, gpus, budget, hardware), shape=grid.shape,
                         size=grid.size, fitting=res.fitting, wall=wall, cpu=cpu,
                         rate=grid.size / wall, peak=peak, whole=whole, whole_cpu=whole_cpu,
                         winner=res.ranked.candidates.layout(0).short()))
    return rows


def linearity(repeat: int) -> list[tuple[float, int, float, float]]:
    """Scan time of every 4th, every 2nd and every split row of the largest grid: three sizes
    with the same mix of layouts (the scan prunes by rules and fit first, so the cost of a row
    depends on how many of its layouts are left; a prefix of the rows would mix small and large
    tp/pp differently from the whole). The three sizes are timed in turn within each repeat (so
    a change of load hits all three alike); min over repeats."""
    m, hw, tr = _setup("megatron-1t")
    opts = SearchOptions(max_gpus=16384)
    grid = build_grid(m, hw, tr, None, opts)
    usable = usable_memory(float(hw.gpu.hbm_capacity), 0.0, 0.0)
    subs = []
    for frac in (0.25, 0.5, 1.0):
        step = round(1 / frac)
        subs.append((frac, Grid({k: v[::step] for k, v in grid.split.items()}, grid.knobs)))
    best = {frac: (float("inf"), float("inf")) for frac, _ in subs}
    for _ in range(repeat):
        for frac, sub in subs:
            t, cpu = _best(lambda: scan(m, hw, tr, sub, opts, usable, None), 1)
            best[frac] = (min(best[frac][0], t), min(best[frac][1], cpu))
    return [(frac, sub.size, *best[frac]) for frac, sub in subs]


def import_time(repeat: int) -> tuple[float, float]:
    """Wall and CPU time of `python -c 'import planner.cli'` (what every command pays first)."""
    return _best(lambda: subprocess.run([sys.executable, "-c", "import planner.cli"], check=True),
                 repeat)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed runs per case after one warm-up (>= 1); the minimum is reported")
    parser.add_argument("--quick", action="store_true",
                        help=f"only the first {QUICK} cases, no linearity check")
    args = parser.parse_args(argv)
    if args.repeat < 1:  # the minimum over zero runs does not exist
        parser.error(f"--repeat must be >= 1, got {args.repeat}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.python_implementation()} "
          f"{platform.python_version()}, numpy {np.__version__}, "
          f"load average {os.getloadavg()[0]:.1f} at start")
    print(f"{'case':<34} {'grid (splits x knobs)':<30} {'layouts':>10} {'fit':>8} "
          f"{'wall s':>7} {'CPU s':>6} {'M/s wall':>9} {'M/s CPU':>8} {'peak MiB':>9} {'command s':>10}")
    for r in case_rows(args.repeat, CASES[:QUICK] if args.quick else CASES):
        shape = " x ".join(str(x) for x in r["shape"])
        print(f"{r['case']:<34} {shape:<30} {r['size']:>10,} {r['fitting']:>8,} "
              f"{r['wall']:>7.3f} {r['cpu']:>6.3f} {r['rate'] / 1e6:>9.2f} "
              f"{r['size'] / max(r['cpu'], 1e-9) / 1e6:>8.2f} {r['peak'] / 2**20:>9.1f} "
              f"{r['whole']:>10.2f}")
        print(f"{'':<34} winner: {r['winner']}")
    if not args.quick:
        print("linear cost (megatron-1t, --max-gpus 16384: every 4th, every 2nd, every split row):")
        base = None
        for frac, size, t, cpu in linearity(args.repeat):
            base = base or (t / size, cpu / size)
            print(f"  {frac:>4.2f}: {size:>10,} layouts  wall {t:.3f} s  CPU {cpu:.3f} s  "
                  f"{size / t / 1e6:.2f} M/s wall; per layout relative to 1/4: wall "
                  f"{t / size / base[0]:.2f}, CPU {cpu / size / base[1]:.2f}")
    imp, imp_cpu = import_time(max(3, args.repeat // 2))
    print(f"command s: `plan3d search -m MODEL -g N --hardware HW --top 1 --json`, whole command, "
          f"wall; `python -c 'import planner.cli'`: wall {imp:.2f} s, CPU {imp_cpu:.2f} s")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"max resident set size of this benchmark process: {rss:.0f} MiB; "
          f"load average {os.getloadavg()[0]:.1f} at end")


if __name__ == "__main__":
    main()
