"""Learning-rate tools: batch-size LR rules, LR-law fitting, effective LR, AdamH, deep scalar linear networks.

Submodules are imported on demand; only `effective` and `adamh` import torch.
"""
