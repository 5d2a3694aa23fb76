"""Readers of a matplotlib figure for the pictures' tests: what an axes writes, a patch's colour, the
patches a drawing named (``gid``)."""

import matplotlib.colors as mcolors


def texts(ax):
    return [t.get_text() for t in ax.texts]


def hex_color(patch):
    return mcolors.to_hex(patch.get_facecolor())


def by_gid(ax):
    return {p.get_gid(): p for p in ax.patches if p.get_gid()}
