"""Engine family adapters: what turns a stack's declaration into a rank's engine command line.

One module per family (``Stack.family``): ``vllm`` today. A new family (issue 34's TensorFold)
adds one module here with the same shape: ``serve_args(stack, profile, ...)``."""
