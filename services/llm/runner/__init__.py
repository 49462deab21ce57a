"""Step runners: run one scheduled batch through the model on a device (PyTorch reference, Triton kernels, CUDA graphs)."""
