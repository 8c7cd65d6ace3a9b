"""The four parts of a device's cost in a plan, in the order every result, cache row, table and plot
keeps them: forward compute (the fused embedding lookups over the whole batch), forward
communication (the all-to-all of pooled embeddings), backward communication (the all-to-all of
their gradients) and backward compute (gradients and sparse optimizer update), in ms. A plan's cost
is the maximum over its devices of the sum of the four."""

COST_PARTS = ("fw_comp", "fw_comm", "bw_comm", "bw_comp")
