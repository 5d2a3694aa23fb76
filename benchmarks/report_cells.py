"""Looking rows up in the bench table and writing their cells, for report.py and report_*.py."""

from __future__ import annotations


def _find(table, **keys):
    for row in table:
        if all(row[k] == v for k, v in keys.items()):
            return row
    return None


def _counts(c: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"


def _span(values, fmt="{:.2f}") -> str:
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else f"{fmt.format(lo)} to {fmt.format(hi)}"
