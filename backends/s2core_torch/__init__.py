"""s2core's PyTorch backend (built in): CUDA first, CPU everywhere. See `s2core_torch.backend`.

Importing this package (or its plugin module) does not import torch.
"""
