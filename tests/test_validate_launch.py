"""plan3d validate --local: the forked ranks die with the process that forked them, even when
it is SIGKILLed (no handler can run then; prctl PR_SET_PDEATHSIG does it in the kernel)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")  # every rank imports torch (launch._child)

if not sys.platform.startswith("linux"):
    pytest.skip("prctl(PR_SET_PDEATHSIG) is Linux only", allow_module_level=True)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_ranks_die_when_the_parent_is_sigkilled(tmp_path):
    # The parent forks 2 ranks that each write their pid and then sleep for 2 minutes.
    script = textwrap.dedent(f"""
        import os, time
        import torch  # once, before forking, as run_local does
        from planner.validate import launch
        def target(cfg):
            open(os.path.join({str(tmp_path)!r}, f"pid{{os.getpid()}}"), "w").close()
            time.sleep(120)
        launch.fork_ranks(2, target, {{"out_dir": {str(tmp_path)!r}}}, timeout_s=120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("pid*"))) < 2:
            assert parent.poll() is None and time.monotonic() < deadline, "the ranks never started"
            time.sleep(0.1)
        ranks = [int(p.name[3:]) for p in tmp_path.glob("pid*")]
        assert all(_alive(pid) for pid in ranks)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 5
        while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in ranks if _alive(pid)]
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in [int(p.name[3:]) for p in tmp_path.glob("pid*")]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)  # only ranks this test started
