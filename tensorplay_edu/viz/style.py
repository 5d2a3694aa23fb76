"""The look shared by every picture in :mod:`tensorplay_edu.viz`:
the rank palette (used only for ranks), the grey of a block held by several ranks, the hatching of a
Partial, the gold of float8 and the two timeline lanes; and the short labels of dtypes and collectives.
"""

from __future__ import annotations

import torch

RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C"]
SHARED_COLOR = "#BBBBBB"
PARTIAL_HATCH = "//"
FLOAT8_COLOR = "#F2C14E"  # float8 pieces (not a rank colour)
FLOAT8_STYLE = dict(boxstyle="round,pad=0.25", facecolor=FLOAT8_COLOR, edgecolor="black", linestyle="--", linewidth=1)
COMM_COLOR = "#8B0000"  # collectives: dark red, darker than rank 3's colour
PHASE_COLORS = {"forward": "#3A3A3A", "backward": "#FFFFFF"}  # comm charts: forward dark, backward white
LANE_COLORS = {"compute": "#1D5C63", "transfer": "#9BD3CB"}  # timeline lanes (not rank colours)
_FLOAT8_TAGS = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float8_e4m3fnuz": "e4m3fnuz",
                "float8_e5m2fnuz": "e5m2fnuz"}


def barred(text: str) -> str:
    """Matplotlib draws a combining overline (f\u0304) on top of the letter or not at all: write f-bar and g-bar
    as mathtext, ``$\\bar{f}$``, so that the picture tells f from f-bar."""
    return text.replace("f\u0304", r"$\bar{f}$").replace("g\u0304", r"$\bar{g}$")


def float8_tag(x) -> str | None:
    """``"e4m3"`` / ``"e5m2"`` (...) when ``x`` (a dtype, a dtype's name, or a label naming one) is
    float8, else None."""
    if isinstance(x, torch.dtype):
        x = str(x).replace("torch.", "")
    words = str(x).replace(",", " ").split()
    for word in words:
        if word in _FLOAT8_TAGS:
            return _FLOAT8_TAGS[word]
        if word in _FLOAT8_TAGS.values():
            return word
    return None


def comm_label(record) -> str:
    """A :class:`~tensorplay_edu.debug.CommRecord` as a short label: its op, then the float8
    format it moved (``"all_gather e4m3"``) and ``"(scalar)"`` for a one-number collective."""
    tag = float8_tag(record.dtype)
    return record.op + (f" {tag}" if tag else "") + (" (scalar)" if tuple(record.shape) == () else "")
