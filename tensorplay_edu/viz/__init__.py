"""Pictures, one concept per file; every function returns the matplotlib Figure (tests read its
patches and texts):

==============  ==============================================================================
``layouts``     what each rank holds, what a transition or a collective moves
``runs``        what a run did: the flow through a parallelized model, CommDebugMode's counts,
                a timeline of compute and transfers, memory bars
``block``       one transformer block as the plans cut it: f, g (SP: g, ḡ), residual skips
``ring``        a collective's ring schedule, step by step
``checkpoint``  a DCP checkpoint's saved chunks and what each rank reads back
``nodes``       which ranks of which node form each group of a (dp, tp) mesh
``style``       the palette and labels shared by all of them
==============  ==============================================================================

Colours: rank r is ``RANK_COLORS[r]``; a block held whole by several ranks (Replicate) is grey and
names its ranks; a Partial block is hatched and says "pending sum".  A float8 piece (1 byte per
element) is drawn in a gold box with a dashed edge and tagged ``e4m3`` / ``e5m2`` (``FLOAT8_STYLE``).
In a timeline, compute is dark teal and transfers pale teal (``LANE_COLORS``, not rank colours); a
layout's frame takes the tensor's proportions (softened, within ``layouts.ASPECT_LIMITS``).
Every public name is importable from ``tensorplay_edu.viz`` itself.
"""

from .block import block_steps, draw_block
from .checkpoint import draw_checkpoint, reads, saved_chunks, wanted_chunks
from .layouts import draw_collective, draw_layout, draw_transition, pieces
from .nodes import draw_nodes, node_groups
from .ring import draw_ring, ring_steps
from .runs import draw_comm_chart, draw_flow, draw_memory, draw_timeline, trace_flow
from .style import (COMM_COLOR, FLOAT8_COLOR, FLOAT8_STYLE, LANE_COLORS, PARTIAL_HATCH, PHASE_COLORS, RANK_COLORS,
                    SHARED_COLOR, comm_label, float8_tag)

__all__ = ["COMM_COLOR", "RANK_COLORS", "SHARED_COLOR", "PARTIAL_HATCH", "FLOAT8_COLOR", "FLOAT8_STYLE", "LANE_COLORS",
           "PHASE_COLORS", "float8_tag", "comm_label",
           "pieces", "draw_layout", "draw_transition", "draw_collective",
           "trace_flow", "draw_flow", "draw_comm_chart", "draw_timeline", "draw_memory",
           "block_steps", "draw_block", "ring_steps", "draw_ring",
           "saved_chunks", "wanted_chunks", "reads", "draw_checkpoint", "node_groups", "draw_nodes"]
