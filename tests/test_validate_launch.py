"""plan3d validate's launchers: --local's forked ranks die with the process that forked them,
even when it is SIGKILLed (no handler can run then; prctl PR_SET_PDEATHSIG does it in the
kernel); the torchrun entry point is as quiet as --local about torch's deprecated collectives."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")  # every rank imports torch (launch._child)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper that never comes counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="prctl(PR_SET_PDEATHSIG) is Linux only")
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


def _deprecated_collectives() -> list[str]:
    """The warnings torch gives for the two collectives the validator calls (no process group:
    each call warns, then raises ValueError)."""
    import torch.distributed as dist
    with warnings.catch_warnings(record=True) as caught:
        for call in (dist.all_gather_into_tensor, dist.reduce_scatter_tensor):
            with pytest.raises(ValueError):
                call(torch.zeros(2), torch.zeros(1))
        warnings.warn("another deprecation", FutureWarning)
    return [str(w.message).split(" is ")[0] for w in caught]


def test_torchrun_entry_point_ignores_only_the_deprecated_collectives(tmp_path, monkeypatch):
    from planner.validate.__main__ import main
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        # torch 2.13 warns about both names (what torchrun printed on every rank).
        assert _deprecated_collectives() == ["`torch.distributed.all_gather_into_tensor`",
                                             "`torch.distributed.reduce_scatter_tensor`",
                                             "another deprecation"]
        # Without torchrun's WORLD_SIZE the run stops at "needs 8 ranks" (exit 2), after the filter.
        from planner.cli import app
        from typer.testing import CliRunner
        assert CliRunner().invoke(app, ["search", "--model", "175b", "--gpus", "512",
                                        "--export", str(tmp_path / "plan.yaml")]).exit_code == 0
        monkeypatch.delenv("WORLD_SIZE", raising=False)
        out = str(tmp_path / "m.json")
        assert main([str(tmp_path / "plan.yaml"), "--miniature", "--out", out]) == 2
        assert _deprecated_collectives() == ["another deprecation"]
