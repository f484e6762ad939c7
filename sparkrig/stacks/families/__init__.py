"""Engine family adapters: what turns a stack's declaration into a rank's engine command line.

One module per family (``Stack.family``): ``vllm`` and ``tensorfold``, each with the same shape:
``serve_args(stack, profile, ...)``."""
