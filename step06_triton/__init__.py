"""Chapter 6: the paged engine's attention as Triton kernels (store, split-KV decode, prefill with prefix).

Importing the chapter has no side effect and loads no kernel. Without a CUDA GPU the kernels run through Triton's
interpreter, which must be switched on before triton is imported: see interpreter.py. The engine on the kernels
is `engine.make_engine`.
"""
