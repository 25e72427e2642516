"""The CPU plugin's ops beyond the core's plain-torch references (``infer.core.ops.reference``):
``torch_native`` attention with the native paged-decode kernel."""
