"""A role whose call waits for an input that does not exist yet (the scorer, handed an engine's rollout ref) still
answers stats() from its watch group: with Ray's default in-order actor queue it did not, and the first GPU
generate (minutes of compilation) ended GRPO runs with "labeler 0 did not answer stats within 30 s"."""
import sys
import time

import pytest

from rlfarm.loops.deadlines import FED_BY_REFS, WATCH
from rlfarm.roles.llm import watch


class Scorer:
    def score(self, value: int) -> int:
        return value + 1

    @watch
    def stats(self) -> dict:
        return {"alive": True}


@pytest.mark.parametrize("fed_by_refs, answers_early", [(True, True), (False, False)])
def test_stats_answers_while_a_call_waits_for_its_input(ray_cpu, fed_by_refs, answers_early):
    ray = ray_cpu
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module

    @ray.remote
    def slow_input() -> int:
        time.sleep(4)
        return 1

    options = FED_BY_REFS if fed_by_refs else {}
    scorer = ray.remote(concurrency_groups=WATCH)(Scorer).options(**options).remote()
    ray.get(scorer.stats.remote())  # started
    scored = scorer.score.remote(slow_input.remote())
    ready, _ = ray.wait([scorer.stats.remote()], timeout=2)
    assert bool(ready) == answers_early
    assert ray.get(scored, timeout=30) == 2
