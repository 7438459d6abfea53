"""Where the time goes, per stage: each role reports cumulative seconds per stage in its stats ("stage_s": runner
act/step/credit_wait/send, labeler gather/launch/upload/upload_wait/model/send/idle, learner update/store/publish/checkpoint/idle); `StageShares` turns
the growth since the last look into each stage's share of the interval, per kind of role, and names the
bottleneck: the kind of role busiest (its time not spent waiting on the others), e.g. "labelers 96 % busy".

Read defensively: a role that reports no "stage_s" (an older role, one restarting) is left out, and a kind of role
none of whose workers reports one gets no keys in the row. A labeler stuck in one model call has not added that
call to its "model" seconds yet: its `in_call_s` counts as model time."""
from __future__ import annotations

# kind of role → (row-key prefix, plural for the bottleneck line, stages that are waiting on another role)
KINDS = {"env_runner": ("runner", "runners", ("credit_wait",)),
         "labeler": ("labeler", "labelers", ("idle",)),
         "learner": ("learner", "learner", ("idle",))}


class StageShares:
    def __init__(self):
        self._seen: dict[tuple[str, int], dict[str, float]] = {}  # (kind, pid) → cumulative stage seconds

    def row(self, stats_by_kind: dict[str, list[dict]], late: tuple[str, ...] = ()) -> dict:
        """{"<prefix>_<stage>_fraction": share of the interval, "<prefix>_busy_fraction": the non-waiting
        share, "bottleneck"} for every kind that reported stage times this interval. Pass the roles that are
        still running: one whose stage times did not grow at all is inside one long stage (a stalled learner),
        and that kind is the bottleneck. `late`: kinds none of whose running roles answered stats in time this
        interval — too busy to answer (e.g. a learner whose GPU queue is full), so none of the others can be named."""
        row, busiest, stuck = {}, None, None
        for kind, stats_list in stats_by_kind.items():
            grown = self._growth(kind, stats_list)
            total = sum(grown.values())
            prefix, plural, waiting = KINDS[kind]
            if total <= 0:
                if grown:  # it reported stage times before, and none ended since
                    stuck = plural
                continue
            shares = {stage: seconds / total for stage, seconds in grown.items()}
            for stage, share in shares.items():
                row[f"{prefix}_{stage}_fraction"] = share
            working = {stage: share for stage, share in shares.items() if stage not in waiting}
            busy = sum(working.values())
            row[f"{prefix}_busy_fraction"] = busy
            if busiest is None or busy > busiest[0]:
                busiest = (busy, plural, working)
        if stuck is not None:
            row["bottleneck"] = f"{stuck}: inside one stage since the last row"
        elif late:
            row["bottleneck"] = f"{' and '.join(KINDS[kind][1] for kind in late)}: stats late (too busy to answer)"
        elif busiest is not None:
            row["bottleneck"] = _bottleneck(*busiest)
        return row

    def _growth(self, kind: str, stats_list: list[dict]) -> dict[str, float]:
        """Seconds each stage grew by since the last look, summed over the kind's workers (a new incarnation,
        a new pid, counts from zero)."""
        grown: dict[str, float] = {}
        for stats in stats_list:
            seconds = dict(stats.get("stage_s") or {})
            if not seconds or "pid" not in stats:
                continue
            if kind == "labeler":
                seconds["model"] = seconds.get("model", 0.0) + float(stats.get("in_call_s", 0.0))
            before = self._seen.get((kind, stats["pid"]), {})
            self._seen[(kind, stats["pid"])] = seconds
            for stage, value in seconds.items():
                grown[stage] = grown.get(stage, 0.0) + max(float(value) - before.get(stage, 0.0), 0.0)
        return grown


def _bottleneck(busy: float, plural: str, working: dict[str, float]) -> str:
    text = f"{plural} {100 * busy:.0f} % busy"
    if len(working) > 1:  # which of its stages: runners busy stepping vs acting, the learner updating vs storing
        stage, share = max(working.items(), key=lambda item: item[1])
        text += f" ({stage} {100 * share:.0f} %)"
    return text


def busy_split(row: dict) -> str | None:
    """ "62/96/40": the busy percent of runners/labelers/learner, for the live view ("-" where not reported)."""
    shares = [row.get(f"{KINDS[kind][0]}_busy_fraction") for kind in KINDS]
    if all(share is None for share in shares):
        return None
    return "/".join("-" if share is None else f"{100 * share:.0f}" for share in shares)
