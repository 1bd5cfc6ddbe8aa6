"""Chapter 6 needs Triton (its interpreter on a CPU, switched on by the root conftest.py before anything imports
triton). Where no Triton wheel exists (scripts/setup.sh says so when it installs), its tests are not collected
rather than failing to import."""
import importlib.util

if importlib.util.find_spec("triton") is None:
    collect_ignore_glob = ["test_*.py"]
