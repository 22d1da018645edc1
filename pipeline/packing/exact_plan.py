"""The mix plan again, with exact token counts in place of the mix stage's estimates.

The planner (pipeline/mixing/planner.py) is a pure function of the sources' unique tokens and the
mix settings that `plan.json` records (budget, epoch caps, priorities, fixed ratios), so the exact plan
is the same call with the counted tokens. A budget the mix stage derived from the target (no
`mix.tokens`) is derived again from the target's exact tokens. Unique tokens are the tokens stored,
EOS included: what training reads.
"""

from __future__ import annotations

from typing import Mapping

from pipeline.mixing.planner import Plan, Source, default_budget, plan_mixture

# plan.json's `budget_from` when the user fixed the budget (pipeline/stages/mix.py).
FIXED_BUDGET = "mix.tokens"


def exact_plan(plan: dict, unique_tokens: Mapping[str, int]) -> Plan:
    """The plan of `plan.json` with `unique_tokens` (by source name) replacing the estimates it has them for.

    Raises the planner's PlanError when a fixed ratio no longer fits the exact counts.
    """
    sources = [Source(s["name"], unique_tokens.get(s["name"], s["unique_tokens_est"]), s["max_epochs"],
                      s["priority"], s["ratio"]) for s in plan["sources"]]
    target, others = sources[0], sources[1:]
    budget = plan["budget_tokens"] if plan["budget_from"] == FIXED_BUDGET else default_budget(target, others)
    return plan_mixture(budget, target, others)
