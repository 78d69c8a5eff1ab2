"""``--why-not``: the verdict on the user's layout (planner.whynot.WhyNot) against the winner."""

from __future__ import annotations

from .. import fmt
from . import tables
from .console import out
from .labels import TIME_LABELS


def why_not_report(verdict) -> None:
    """Print a WhyNot verdict: invalid (the rules), no fit (the closest miss), the winner (or a
    tie with it), or slower (by how much, and the step-time terms side by side)."""
    if verdict.status == "invalid":
        out.print(f"[bold red]{verdict.text}: invalid[/] — it breaks: " + "; ".join(verdict.reasons))
        return
    if verdict.status == "no-fit":
        out.print(f"[bold red]{verdict.text}: does not fit[/] — {'; '.join(verdict.reasons)}")
        return
    mine = verdict.completion
    out.print(f"{verdict.text}: best completion {mine.candidates.layout(0).short()}")
    if verdict.status == "winner":
        _winner(verdict)
        return
    s = verdict.slower_by  # >= 1: "2.34x the winner's time" reads better than "134% slower"
    lead = f"{fmt.percent(s)} slower than" if s < 1 else f"{1 + s:.2f}x the time per token of"
    out.print(f"[bold]{lead} the winner[/] "
              f"{verdict.winner.candidates.layout(0).short()}: {'; '.join(verdict.reasons)}.")
    t = tables.new()
    tables.text_column(t, "term")
    for col in ("yours", "winner", "difference"):
        tables.number_column(t, col)
    values = [(float(mine.time[term][0]), float(verdict.winner.time[term][0]), d)
              for term, d in verdict.deltas]
    unit = fmt.duration_unit([v for row in values for v in row])  # one unit for the three columns
    for (term, _), (yours, best, d) in zip(verdict.deltas, values):
        t.add_row(TIME_LABELS[term], fmt.seconds_in(yours, unit), fmt.seconds_in(best, unit),
                  fmt.signed_seconds(d, unit))
    tables.show(t, out)


def _winner(verdict) -> None:
    mine = verdict.completion
    best = verdict.winner.candidates.layout(0) if verdict.winner is not None else None
    if best is None or best == mine.candidates.layout(0):
        if verdict.fastest is not None:
            out.print(f"[bold green]It is the search's pick[/]: the tie preferences chose it "
                      f"(headroom, checked terms, convention, fewer stages); the fastest, "
                      f"{verdict.fastest.short()}, is {fmt.percent(verdict.fastest_by, 1)} faster "
                      "(--strict-rank ranks by speed alone).")
        else:
            out.print("[bold green]It is the winner[/] (no fitting layout beats it).")
        return
    ahead = float(mine.throughput["tokens_per_s"][0]) / float(
        verdict.winner.throughput["tokens_per_s"][0]) - 1.0
    if ahead > 1e-9 and verdict.tie_band is not None:  # the pick is not the fastest: ties
        out.print(f"[bold green]It is {fmt.percent(ahead, 2)} faster than the search's pick[/] "
                  f"{best.short()}, which the tie preferences chose (headroom, checked terms, "
                  "convention; --strict-rank ranks by speed alone).")
    elif ahead > 1e-9:  # the search should have found it: say so rather than call it a tie
        out.print(f"[bold yellow]It is {fmt.percent(ahead, 2)} faster than the search's pick[/] "
                  f"{best.short()}: the search did not reach it (please report this).")
    else:  # e.g. the distributed optimizer against ZeRO-1
        out.print(f"[bold green]It ties the winner[/] {best.short()} (no fitting layout beats it).")
