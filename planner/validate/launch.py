"""Start N ranks on this machine by forking after one ``import torch`` (CPU/gloo only).

Forking skips N fresh imports of torch (about 20 s against 50 s for 8 ranks on 2 cores,
validator_notes.md section 1). Each child gets torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), one intra-op thread, and runs ``target(cfg)``; a failure
is written to ``rank{R}.err`` in cfg["out_dir"]. On Linux each rank dies with this process,
even when it is SIGKILLed (die_with_parent). Never fork after CUDA was initialised.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# torch.distributed deprecates the two collectives the validator calls (FutureWarning "`torch.
# distributed.all_gather_into_tensor` is deprecated. Please use `...all_gather_single` instead.",
# torch/distributed/distributed_c10d.py); the old names run on every torch the validator supports.
DEPRECATED_COLLECTIVES = (r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` "
                          r"is deprecated")


def quiet_collective_deprecations() -> None:
    """Ignore only torch.distributed's FutureWarning about all_gather_into_tensor and
    reduce_scatter_tensor (every other warning still shows): the torchrun entry point prints
    no more than ``--local``, whose ranks ignore FutureWarning altogether (_child)."""
    import warnings
    warnings.filterwarnings("ignore", message=DEPRECATED_COLLECTIVES, category=FutureWarning)


PR_SET_PDEATHSIG = 1  # prctl(2), <linux/prctl.h>


def die_with_parent(parent: int) -> bool:
    """Linux: have the kernel SIGKILL this process when ``parent`` (the pid that forked it) dies.

    prctl(PR_SET_PDEATHSIG, SIGKILL) (prctl(2)), so a SIGKILLed ``plan3d validate --local``
    leaves no orphaned ranks; if the parent is already gone (it died before the call), exit
    at once. Returns False where prctl is unavailable (not Linux), doing nothing.
    """
    import signal
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != parent:
        os._exit(1)
    return True


def _child(rank: int, world: int, port: int, target, cfg: dict, parent: int) -> None:
    die_with_parent(parent)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import warnings

    import torch
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # deprecations inside torch
    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.")
    try:
        target(cfg)
    except BaseException:  # noqa: BLE001 - reported to the parent through the file
        Path(cfg["out_dir"]).mkdir(parents=True, exist_ok=True)
        (Path(cfg["out_dir"]) / f"rank{rank}.err").write_text(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def fork_ranks(world: int, target, cfg: dict, timeout_s: float) -> list[int]:
    """Run ``target(cfg)`` as ``world`` forked ranks; returns their exit codes (-9: killed on timeout)."""
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    port = free_port()
    parent = os.getpid()
    procs = [ctx.Process(target=_child, args=(r, world, port, target, cfg, parent))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(p.is_alive() for p in procs):
        if any(p.exitcode not in (None, 0) for p in procs):
            break  # one rank failed: the others would wait for it until the gloo timeout
        time.sleep(0.1)
    codes = []
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
            codes.append(-9)
        else:
            codes.append(p.exitcode)
    return codes
