"""A measured run predicted not to fit is a false OOM once --resolve search has run, whether
its layout was fully stated, resolved by the search or costed in place (every run in a runs file
ran); under --resolve default a no-fit may come from the defaults and is not counted."""
from types import SimpleNamespace

import pytest

from planner.fidelity.compare import is_false_oom


@pytest.mark.parametrize("fits,resolution,expected", [
    (False, "stated", True),         # e.g. Bridge 25.11 B200 GPT-OSS-120B: every setting stated
    (False, "false-oom", True),      # no layout consistent with the source fits
    (False, "outside-space", True),  # costed in place, nothing fits
    (True, "stated", False),
    (True, "resolved", False),
    (False, "", False),              # --resolve default: not counted
])
def test_false_oom_definition(fits, resolution, expected):
    c = SimpleNamespace(fits=fits, case=SimpleNamespace(resolution=resolution))
    assert is_false_oom(c) is expected
