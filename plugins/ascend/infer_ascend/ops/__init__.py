"""The Ascend ops, each on torch_npu's API (imported only when the core picks them)."""
