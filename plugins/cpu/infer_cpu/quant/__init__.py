"""Weight-quantized linear methods for the CPU plugin.

They run on torch's stock CPU weight-only kernels: ``aten._weight_int4pack_mm_for_cpu`` (int4,
group 32, bf16 activations) and ``aten._weight_int8pack_mm`` (int8, one scale per output row).
"""
