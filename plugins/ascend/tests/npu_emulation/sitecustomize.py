"""For a server subprocess started by a test with this folder on PYTHONPATH: when
INFER_TEST_NPU_EMULATION names a generation (A2 or A3), switch the torch_npu emulation on and
make the Ascend probe find one emulated chip. Read only here, in the tests' folder: the plugin
itself never looks at this variable, so it is no runtime fallback."""

import os

_gen = os.environ.get("INFER_TEST_NPU_EMULATION")
if _gen:
    import ascend_emulation

    ascend_emulation.install(_gen)
    ascend_emulation.patch_probe(_gen)
