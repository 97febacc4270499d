"""Exact (Clopper–Pearson) interval of a binomial proportion, and the chance check.

For ``k`` successes in ``n`` independent trials and ``alpha = 1 - level``, the two-sided
interval ``[p_L, p_U]`` is the set of ``p`` that an equal-tailed exact test does not
reject::

    P(X >= k | n, p_L) = alpha / 2      (p_L = 0 when k = 0)
    P(X <= k | n, p_U) = alpha / 2      (p_U = 1 when k = n)

equivalently ``p_L = B^-1(alpha/2; k, n-k+1)`` and ``p_U = B^-1(1-alpha/2; k+1, n-k)``
(Beta quantiles). It covers the true ``p`` with probability >= ``level`` for every ``p``
and ``n`` (conservative, unlike the Wald or a percentile bootstrap of 0/1 values).

An accuracy is *above chance* when ``p_L > chance``: the one-sided exact test of
``p <= chance`` rejects at ``alpha / 2``.
"""

from cwlens.errors import InvalidArgumentError


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """``(p_L, p_U)`` for ``k`` of ``n`` (see the module docstring)."""
    for name, value in (("k", k), ("n", n)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidArgumentError(f"{name} must be an int (a count); got {value!r}.")
    if not 0 <= k <= n or n < 1:
        raise InvalidArgumentError(
            f"need 0 <= k <= n and n >= 1 (k correct of n items); got k={k}, n={n}.")
    if isinstance(level, bool) or not isinstance(level, float | int) or not 0 < level < 1:
        raise InvalidArgumentError(f"level must be a number in (0, 1), e.g. 0.95; got {level!r}.")
    from scipy.special import betaincinv  # heavy: scipy (undeclared), imported on use

    alpha = 1.0 - level
    low = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, alpha / 2))
    high = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - alpha / 2))
    return low, high


def above_chance(low: float, chance: float) -> bool:
    """The interval's lower end clears chance (strictly)."""
    return low > chance
