"""The committed benchmark record read back (notebook 06b, section 4): ``make bench`` writes
``benchmarks/results.md`` (its floor table by ``benchmarks/report_floor.py``); :func:`floor_rows` reads that table,
so the notebook quotes the record rather than timing anything on the reader's machine."""

from pathlib import Path

__all__ = ["floor_rows"]


def floor_rows(results_md):
    """The rows of the floor table (the markdown table after the heading "## The floor..."), as {column: cell}
    dicts, each "range" column named for the ratio before it ("ours/hand range"); and the "Run: ..." line above
    the tables (None in older files)."""
    lines = Path(results_md).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("## The floor"))
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table or line.startswith("## "):
            break  # the end of the table (or a heading before any)
    header, rows = table[0], table[2:]  # table[1] is the |---| line
    header = [f"{header[i - 1]} range" if name == "range" else name for i, name in enumerate(header)]
    run = next((line for line in lines[:start] if line.startswith("Run: ")), None)
    return [dict(zip(header, row)) for row in rows], run
