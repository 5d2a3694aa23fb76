"""Pictures, one concept per file; every function returns the matplotlib Figure (tests read its
patches and texts):

================  ==============================================================================
``layouts``       what each rank holds, what a transition or a collective moves
``gradients``     a move forward and its gradient's move backward, both as layouts
``heads``         attention heads per rank: GQA's query and kv heads, a view's cuts into heads
``head_cuts``     where torch.chunk cuts wq when t does not divide the heads
``kv_copies``     t > K: each rank's copy of the kv head its query heads read, the copies' gradient sum
``runs``          what a run did: the flow through a parallelized model, memory bars, loss differences,
                  the order of a backward's gradient collectives
``timelines``     compute beside transfers in time: a run's intervals, one timeline per ring
``float8``        float8's values, why its amax is global
``block``         one transformer block as the plans cut it: f, f̄ (SP: g, ḡ), residual skips
``ring``          a collective's ring schedule, step by step; async TP's schedules and step costs
``checkpoint``    a DCP checkpoint's saved chunks and what each rank reads back
``nodes``         which ranks of which node form each group of a (dp, tp) mesh
``hf_layer``      an HF decoder layer under HF's own plan or the fixed one: where f and f̄ sit
``qkv_rows``      a fused qkv weight's rows in two orders, and each rank's slice of them
``logits``        the vocabulary split: the logits and their gradient in the ranks' class blocks
``vocab``         the vocab-parallel lookup as a sum: each rank's mostly-zero addend, then the lookup
``sandwich``      PrepareModuleInputOutput's g in front of a module and ḡ after it, both ways
``mlp``           Megatron's MLP on one rank: f, ColwiseParallel, ReLU, RowwiseParallel, f̄
``zoo``           the bug zoo: a view's head groups; the ranks' dropout masks
``costs``         what a step costs at scale: setups and layouts, TP's intensity
``addends``       a Partial tensor's addends with their values, summed
``alltoall``      an all-to-all's pieces, each in its source rank's colour before and after
``links``         a collective's α–β time per link; a layer's compute against its TP traffic
``gains``         a model's gain beside the measured one, pair by pair
``link_bytes``    one ring step's bytes per link and direction, a ring one way against both ways
``fits``          what fits on one GPU: a layout's memory per GPU in four groups, against the GPU
``fit_panels``    activations per GPU in panels on one y-axis, against the GPU and what the step leaves
``style``         the palette and labels shared by all of them
================  ==============================================================================

Colours: rank r is ``RANK_COLORS[r]``; a block held whole by several ranks (Replicate) is grey and
names its ranks; a Partial block is hatched and says "pending sum".  A float8 piece (1 byte per
element) is drawn in a gold box with a dashed edge and tagged ``e4m3`` / ``e5m2`` (``FLOAT8_STYLE``).
In a timeline, compute is dark teal and transfers pale teal (``LANE_COLORS``, not rank colours); a
layout's frame takes the tensor's proportions (softened, within ``layouts.ASPECT_LIMITS``).
Every public name is importable from ``tensorplay_edu.viz`` itself.
"""

from .block import block_changes, block_steps, draw_block_pair, draw_steps
from .checkpoint import draw_checkpoint, reads, saved_chunks, wanted_chunks
from .float8 import draw_amax_slices, draw_float8_values
from .gradients import draw_move_and_gradient
from .head_cuts import cut_rows, draw_head_cuts
from .heads import draw_gqa, draw_head_split, draw_head_views, heads_per_rank, row_chunks
from .kv_copies import draw_kv_copies, kv_copy_of_rank
from .layouts import draw_collective, draw_collectives, draw_layout, draw_transition, pieces
from .logits import draw_logits_and_gradient
from .vocab import draw_vocab_addends
from .sandwich import draw_prepare_sandwich, sandwich_steps
from .mlp import draw_mlp, mlp_comms, mlp_steps
from .nodes import draw_mesh_grid, draw_nodes, node_groups
from .hf_layer import draw_layer_plan
from .addends import draw_addends
from .fit_panels import draw_fit_panels
from .alltoall import draw_all_to_all
from .gains import draw_gain_pairs
from .ring import draw_ring, draw_ring_step_costs, draw_schedules, draw_step_grid, ring_steps
from .runs import draw_flow, draw_grad_sync_order, draw_memory, draw_relative_differences, trace_flow
from .style import (COMM_COLOR, FLOAT8_COLOR, FLOAT8_STYLE, LANE_COLORS, PARTIAL_HATCH, PHASE_COLORS, RANK_COLORS,
                    SHARED_COLOR, comm_label, float8_tag)
from .timelines import draw_ring_timelines, draw_timeline
from .costs import draw_layouts, draw_setups, draw_tp_intensity
from .links import draw_alpha_beta, draw_layer_verdict
from .link_bytes import draw_link_bytes, link_bytes
from .fits import MEMORY_GROUP_COLORS, MEMORY_GROUPS, draw_memory_parts, memory_groups
from .zoo import draw_dropout_masks, draw_view_groups
from .qkv_rows import draw_qkv_rows

__all__ = ["MEMORY_GROUPS", "MEMORY_GROUP_COLORS", "memory_groups", "draw_memory_parts",
           "COMM_COLOR", "RANK_COLORS", "SHARED_COLOR", "PARTIAL_HATCH", "FLOAT8_COLOR", "FLOAT8_STYLE", "LANE_COLORS",
           "PHASE_COLORS", "float8_tag", "comm_label",
           "pieces", "draw_layout", "draw_transition", "draw_collective", "draw_collectives", "draw_move_and_gradient",
           "heads_per_rank", "draw_gqa", "draw_head_views", "row_chunks", "draw_head_split", "kv_copy_of_rank", "draw_kv_copies",
           "trace_flow", "draw_flow", "draw_memory", "draw_relative_differences",
           "draw_grad_sync_order",
           "draw_timeline", "draw_ring_timelines",
           "draw_float8_values", "draw_amax_slices",
           "block_steps", "block_changes", "draw_block_pair", "draw_steps",
           "cut_rows", "draw_head_cuts",
           "link_bytes", "draw_link_bytes", "draw_alpha_beta", "draw_layer_verdict", "draw_gain_pairs",
           "draw_logits_and_gradient", "draw_vocab_addends",
           "draw_prepare_sandwich", "sandwich_steps",
           "mlp_steps", "mlp_comms", "draw_mlp",
           "ring_steps", "draw_ring", "draw_schedules", "draw_step_grid", "draw_ring_step_costs",
           "saved_chunks", "wanted_chunks", "reads", "draw_checkpoint", "node_groups", "draw_nodes", "draw_mesh_grid",
           "draw_layer_plan", "draw_addends", "draw_all_to_all", "draw_fit_panels",
           "draw_view_groups", "draw_dropout_masks", "draw_qkv_rows",
           "draw_setups", "draw_tp_intensity", "draw_layouts"]
