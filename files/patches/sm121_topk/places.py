"""The SM121 top-k fix as a source transformation of the base image's own
``vllm/model_executor/layers/sparse_attn_indexer_kpool.py`` (stdlib only, read by apply_patches.py).

Each place is ``(what it is, anchor, replacement)``; the applier refuses the build unless every
anchor occurs exactly once in the image's file. A place whose replacement is its anchor is only
checked. Sources and the hash check that ties this to the pinned base image: docs/sm121.md.

1. The decode top-k dispatch. vLLM sends decode top-k to ``torch.ops._C.persistent_topk``
   whenever ``select_k in (512, 1024, 2048)``; GLM-5.3-Flash has select_k = 2048 // 4 = 512. On
   GB10 (48 SMs, 101,376 B shared memory per block) the kernel oversubscribes past ~24K tokens of
   context and its FilteredTopK fallback needs 128 KB, so it raises and the engine dies.
   tonyd2wild's fix (``docker/sparse_attn_indexer_kpool_sm121.py``) keeps the kernel only on
   parts with at least 78 SMs; GB10 takes the existing ``top_k_per_row_decode`` path. The
   replacement is that file's text, byte for byte.
2. The -1 initialisation of the pool top-k buffers (prefill and decode). The top-k kernels only
   write ``min(select_k, valid)`` entries per row; tonyd2wild's v7 image fills the rest with -1
   instead of ``torch.empty`` garbage. The pinned v11 base already carries it, so it is checked,
   not changed: a base without it lacks the fixes this stack builds on.
"""

DISPATCH = "\n        if current_platform.is_cuda() and select_k in (512, 1024, 2048):\n"
DISPATCH_SM121 = (
    "\n        # SM121/GB10 (48 SMs, 99KB smem): persistent_topk oversubscribes past\n"
    "        # ~24K ctx and its FilteredTopK fallback needs 128KB smem -> hard raise.\n"
    "        # Route small-SM parts to top_k_per_row_decode instead.\n"
    "        if (\n"
    "            current_platform.is_cuda()\n"
    "            and select_k in (512, 1024, 2048)\n"
    "            and torch.cuda.get_device_properties(0).multi_processor_count >= 78\n"
    "        ):\n"
)


def _init_minus_one(indent: str) -> str:
    return (
        f"\n{indent}pool_topk = torch.full(\n"
        f"{indent}    (num_rows, select_k), -1, dtype=torch.int32, device=logits.device\n"
        f"{indent})\n"
    )


PREFILL_INIT = _init_minus_one(" " * 16)
DECODE_INIT = _init_minus_one(" " * 12)

PLACES = [
    ("the decode top-k dispatch (persistent_topk only on >= 78 SMs)", DISPATCH, DISPATCH_SM121),
    ("the -1 initialisation of the prefill pool top-k", PREFILL_INIT, PREFILL_INIT),
    ("the -1 initialisation of the decode pool top-k", DECODE_INIT, DECODE_INIT),
]
