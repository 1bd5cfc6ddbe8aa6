"""Chapter 6 needs Triton (its interpreter on a CPU). Where no Triton wheel exists (scripts/setup.sh says so
when it installs), its tests are not collected rather than failing to import. Without a CUDA GPU the kernels
run through Triton's interpreter, which must be on before any kernel is defined: here, before the test modules
(and the kernels they import, or define) are loaded."""
import importlib.util
import os

if importlib.util.find_spec("triton") is None:
    collect_ignore_glob = ["test_*.py"]
elif importlib.util.find_spec("torch") is not None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
