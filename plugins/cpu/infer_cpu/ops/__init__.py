"""Plain-torch reference ops of the CPU plugin: attention over the paged KV cache, dense linear,
MoE experts and the gloo communicator. Other plugins' kernels are tested against these."""
