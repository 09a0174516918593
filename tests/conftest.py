"""Test-suite settings live in the kvconform pytest plugin (``conformance/pytest_plugin.py``).

The plugin (the ``pytest11`` entry point of this package) registers the hypothesis profiles
``kvconform-ci``/``kvconform-thorough``/``kvconform-gpu`` and loads one explicitly in
``pytest_configure`` (``--kvconform-profile``, default ``ci``), so ``CI=true``, which makes
hypothesis load its own ``ci`` profile at import, changes nothing. It also draws the
seeded case samples (``--kvconform-seed``, ``--kvconform-examples``) and prints them in
the header. The one setting here is the Triton interpreter for vLLM's block-table
kernels on a machine without a GPU (below).
"""

# pytester's fixtures for tests/plugin/ (``pytest_plugins`` is only allowed in a top-level
# conftest such as this one).
pytest_plugins = ["pytester"]

import os as _os

# vLLM's block-table kernels are Triton kernels; on a machine without a GPU they run in
# the Triton interpreter, which must be chosen before anything imports vLLM (that is
# why it is set here, the first file pytest loads, and inherited by xdist workers). On a
# GPU machine the CUDA path's tests need the real devices, so nothing is changed there
# and the runner-level schedule checks say they cannot run.
if not _os.path.exists("/dev/nvidiactl"):
    from gpu_impl.vllm_cpu.runner_tables import prepare_process_env as _prepare_triton_interpreter

    _prepare_triton_interpreter()
