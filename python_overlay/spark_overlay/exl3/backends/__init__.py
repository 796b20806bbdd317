"""EXL3 back ends: the CPU reference apply, exllamav3's CUDA kernels, the fused-MoE schedule.

`select` chooses the back end and is the only module of the overlay's EXL3
code that reads an environment variable. Nothing here imports vLLM.
"""
