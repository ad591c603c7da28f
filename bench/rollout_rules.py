"""The controller's failure rule (controller/rules.py), its error rates computed exactly: the probability that a
build is rejected, summed over every outcome of two binomial windows (canary and control, n requests each).

    .venv/bin/python bench/rollout_rules.py
"""

from __future__ import annotations

import math

from controller.rules import failure_rejects

BASE = 0.005  # the baseline's failure probability
INCREASE = 0.01  # --max-failure-increase, the default


def pmf(n: int, p: float) -> list[tuple[int, float]]:
    out = []
    for k in range(n + 1):
        v = math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                     + (k * math.log(p) if k else 0.0) + ((n - k) * math.log1p(-p)))  # fmt: skip
        if v > 1e-12:
            out.append((k, v))
    return out


def rejected(n: int, pc: float, pb: float) -> float:
    canary, base = pmf(n, pc), pmf(n, pb)
    return sum(a * b for kc, a in canary for kb, b in base if failure_rejects(kc, n, kb, n, INCREASE))


if __name__ == "__main__":
    print(f"baseline failure probability {BASE:.1%}, --max-failure-increase {INCREASE:g}, n requests on each side")
    for n in (100, 1000):
        print(
            f"n={n:>5}: false reject (no regression) {rejected(n, BASE, BASE):.2%}; "
            f"miss of a +1 % regression {1 - rejected(n, BASE + 0.01, BASE):.1%}; "
            f"miss of a +2 % regression {1 - rejected(n, BASE + 0.02, BASE):.1%}"
        )
