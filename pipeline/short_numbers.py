"""Numbers for reports and logs: three significant digits and a unit prefix (2.63M tokens, 2.63 MB)."""

from __future__ import annotations


def _scaled(n: float, prefixes: tuple[tuple[str, float], ...], ones: str) -> str:
    for prefix, size in prefixes:
        if abs(n) >= size:
            return f"{n / size:.3g}{prefix}"
    return f"{n:.0f}{ones}"


def tokens_text(n: float) -> str:
    """1234567 -> '1.23M' (B for billions, as token budgets are written)."""
    return _scaled(n, (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)), "")


def bytes_text(n: float) -> str:
    """2627032 -> '2.63 MB'."""
    return _scaled(n, ((" TB", 1e12), (" GB", 1e9), (" MB", 1e6), (" kB", 1e3)), " B")
