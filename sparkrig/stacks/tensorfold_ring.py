"""Stack `tensorfold-ring`: MiaAI's TensorFold recipe on three Sparks (a triangle) or four (a
switchless ring), the tp4 branch's N-rank build (docs/stacks.md
"tensorfold-ring", docs/rings.md).

Why a stack of its own, not the `tensorfold` stack's image chosen by the rank count:

- a stack is one image pinned by digest (sparkrig/stacks/base.py): the pin's precedence
  (``base_image`` > ``stack_pins[<stack>]`` > the declaration), the release record, the image copy
  and uninstall all resolve one image per stack name. Choosing it by rank count would make every
  reader of ``Stack.image`` take the rank count, and an operator's pin for the pair would land on a
  ring unseen;
- the builds differ in provenance: `tensorfold` serves MiaAI's released v1.10 image (96 patches,
  measured on two Sparks); this one the tp4 branch's unreleased build (106 patches: v1.10's 96 plus
  ten of 0098-0109), the one published image whose config serves three and four. The release
  record's stack name then says which build served;
- the pair's declaration, its tests and every golden stay as they are.

Both share the engine family (``engines/tensorfold.py``), the weights and their lockfiles. What
differs by rank count (TensorFold's engine over the LAN-rendezvoused triangle or ring) is in
``env_by_nodes`` (``Stack.at``) and in each figure's ``nodes``.

The per-rank fabric env (NCCL over every device facing a peer, TF_ROCE_HCA, the ring's graph
files) is the fabric layer's (``topology.fabric_env``, from the plan); this declaration lists
what the engine needs in it (``fabric_env_needs``, each value with its source) and
``engines/tensorfold.py`` checks one against the other and builds the ring's graph files.

Short names of the sources:

- CONFIG: MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks-TensorFold scripts/config.sh at the tp4
  branch's 336811f8 (stored copy id 71072633806): IMAGE_TAG/IMAGE_DIGEST ("The same image serves
  two, three and four Sparks"), PARALLEL, COMM, KV_POOL_GIB, the TP=4 defaults
- NODES: the same repository's scripts/nodes.sh at 14a5e91c (stored copy id 71619227959):
  ``nccl_env_n`` (TP>2), ``ring_graphs``/``graph_xml``, ``check_workers`` (TP 2, 3 or 4)
- RESEARCH: shared/research/tensorfold.md ("NCCL / RoCE env per rank", 5, 6), where the figures
  are quoted from the recipe's README (3 Sparks at 05f75fde, 4 Sparks at 336811f8; not re-read)
"""

from __future__ import annotations

import sparkrig.stacks.tensorfold as pair
from sparkrig.stacks.base import Figure, Profile, Stack

CONFIG = (
    "MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks-TensorFold scripts/config.sh@336811f8 "
    "(tp4 branch, stored copy id 71072633806)"
)
NODES = (
    "MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks-TensorFold scripts/nodes.sh@14a5e91c "
    "(stored copy id 71619227959)"
)
README_TP3 = (
    "MiaAI README.md@05f75fde '3 Sparks', as shared/research/tensorfold.md section 6 quotes it"
)
README_TP4 = (
    "MiaAI README.md@336811f8 '4 Sparks', as shared/research/tensorfold.md section 6 quotes it"
)
SPARKDASH = "sparkDash through the OpenAI API, the recipe's defaults, one boot"

# CONFIG's switches at three and four Sparks (every rank the same value: the ranks compare
# settings at start). The first half of CONFIG, as the pair's declaration carries v1.10's.
RECIPE_ENV = {
    "TENSORFOLD_NO_UPDATE_CHECK": "1",  # CONFIG exports it; the image's updater asks GitHub else
    "TF_GLM_MTP": "auto",
    "TF_GLM_KV": "fp8",
    "TF_GLM_DENSE": "q4",
    "TF_ROCE_WAIT_S": "300",
    "TF_GLM_COPY_DRAFTS": "1",
    "TF_GLM_COPY_MAX": "15",
    "TF_GLM_DFLASH_POLICY": "fnc7:0.3",
    "TF_GLM_HC_SPLIT": "1",
    "TF_GLM_PREFILL_OVERLAP": "2",
    "TF_GLM_KDA_CHUNKED": "1",
    "TF_GLM_WIDE_GRAPHS": "16",
    "TF_GLM_COPY_REPLY_MATCH": "16",
    "TF_GLM_MULTI_LONE": "0",
    # CONFIG: "64 past 4 requests, else 32", and PARALLEL is 8 at TP != 2 with DFlash2
    "TF_GLM_MULTI_WINDOW": "64",
    # CONFIG: past 32 rows "TF_ROCE_MAX_KB rises with it (64 rows: 1024)"
    "TF_ROCE_MAX_KB": "1024",
    # CONFIG: "case $TP in 3|4) _pool=32": each rank holds fewer weights, the pool takes more
    "TF_GLM_CACHE_GIB": "32",
    # CONFIG: 14.5 + 0.95 a request past 4 + 0.04 a row past 32 = 19.58, printed "%.1f"
    "TENSORFOLD_MEMORY_RESERVE_GIB": "19.6",
}

ENV_BY_NODES = {
    # CONFIG: "Three Sparks and four on a switch default to nccl (start-tp3.sh, start-tp4.sh)"
    3: {"TF_GLM_COMM": "nccl"},
    4: {
        # CONFIG: "A ring of four (start-tp4-switchless.sh) defaults to roce: it writes to the two
        # neighbours, which relay to the Spark across (patch 0099, TF_ROCE_RING=1)"
        "TF_GLM_COMM": "roce",
        # CONFIG: on by default at TP=4 (patches 0102, 0104 with 4,096-row chunks, 0105)
        "TF_GLM_PROMPT_OWN_FRONT": "1",
        "TF_GLM_PROMPT_MICROBATCH": "1",
        "TF_GLM_PREFILL_ROWS": "4096",
        "TF_GLM_SIDE": "1",
    },
}

# What the engine needs in every rank's fabric env at TP>2 (NODES ``nccl_env_n``; RESEARCH "NCCL /
# RoCE env per rank", TP>2), and what a switchless ring of four adds (NODES's ring branch, CONFIG's
# TF_ROCE_RING; RESEARCH "4-Spark ring adds"). NCCL_IB_HCA and TF_ROCE_HCA are per rank (every
# device facing a peer): checked equal, not listed here. NCCL_IB_GID_INDEX must be absent: NODES
# sets it only when one index holds on all of a node's devices; sparkrig never pins it (GID by
# value per device, docs/rings.md).
TP_N_NEEDS = {
    # NODES: "each cable joins port 0 of one node to port 1 of the next, and NCCL otherwise pairs
    # device index with device index (ibv_modify_qp ... Connection timed out)"
    "NCCL_CROSS_NIC": "1",
    "NCCL_IB_SUBNET_AWARE_ROUTING": "1",  # NODES: each peer through the device on its subnet
    "NCCL_P2P_DISABLE": "1",  # NODES: "no P2P or SHM transport (one GPU a node)"
    "NCCL_SHM_DISABLE": "1",
    "NCCL_MIN_NCHANNELS": "4",  # NODES: NCCL_CHANNELS, 4 (also the graph files' channel count)
    "NCCL_MAX_NCHANNELS": "4",
}
RING_NEEDS = {
    # NODES: "nothing may go to the ranks across it, which no cable reaches: NCCL_ALGO=Ring"
    "NCCL_ALGO": "Ring",
    "NCCL_IB_MERGE_NICS": "0",  # NODES: "with NCCL's NIC fusion off"
    "NCCL_GRAPH_FILE": "/nccl-graph.xml",  # NODES: the rank's graph file, mounted read-only
    # NODES: patch 0076's ring exchange over two-rank links with the neighbours
    "TF_NCCL_RING": "1",
    "TF_NCCL_RING_GRAPHS": "/nccl-link-prev.xml,/nccl-link-next.xml",
    "TF_ROCE_RING": "1",  # CONFIG: the RoCE all-gathers relayed by the neighbours (patch 0099)
}

PROFILES = {
    "shared": Profile(
        "shared",
        max_model_len=1048576,  # --context: CONFIG's default with KV=fp8
        max_num_seqs=8,  # --parallel: CONFIG's default at TP != 2 with DFlash2 ("8 on three")
        speculative="dflash",
        doc=(
            "DFlash2 drafts, 8 requests at once, 1,048,576-token window: MiaAI's default on three "
            "and four Sparks (77.6 / 95.2 tok/s prose alone)"
        ),
    ),
    "single": pair.PROFILES["single"],  # CONFIG: mtp serves one request at a time (PARALLEL=1)
}


def _figures(nodes: int, source: str, single: float, four: float, eight: float, prefill: float
             ) -> tuple[Figure, ...]:  # fmt: skip
    cond = f"{nodes} Sparks, {SPARKDASH}"
    return (
        Figure("single_stream_tok_s", single, "tok/s", "miaai", source, "shared",
               condition=f"prose, 1 stream; {cond}", nodes=nodes),
        Figure("decode_tok_s.4", four, "tok/s", "miaai", source, "shared",
               condition=f"prose, 4 streams aggregate; {cond}", nodes=nodes),
        Figure("decode_tok_s.8", eight, "tok/s", "miaai", source, "shared",
               condition=f"prose, 8 streams aggregate (PARALLEL=8); {cond}", nodes=nodes),
        Figure("prefill_tok_s", prefill, "tok/s", "miaai", source, "shared",
               condition=f"8k prompt; {cond}", nodes=nodes),
    )  # fmt: skip


STACK = Stack(
    name="tensorfold-ring",
    family="tensorfold",
    title=(
        "MiaAI tp4 branch: TensorFold 0.6.0 (106 patches) on a triangle of 3 or a ring of 4, "
        "EXL3 4bpw target, DFlash2 or MTP drafts"
    ),
    image=(
        "ghcr.io/miaai-lab/glm-5.3-flash-exl3-2x-dgx-sparks-tensorfold"
        "@sha256:eb17e092fa56ea23ca385c3aba0a4250d0cb46c705b9455f2e4c29d1ca4847e8"
    ),
    image_note=(
        "MiaAI's tp4-branch image, tag v0.6.0-7a37454d3238 (CONFIG's IMAGE_TAG and IMAGE_DIGEST, "
        "'The same image serves two, three and four Sparks'): nvcr.io/nvidia/pytorch:26.07-py3 + "
        "TensorFold v0.6.0 + 106 patches (v1.10's 96 plus ten of 0098-0109), unreleased, arm64. "
        "Pulled by digest; no sparkrig patch layer."
    ),
    patched=False,
    model=pair.STACK.model,  # CONFIG pins the same MODEL_REVISION as v1.10 (078455ff)
    drafter=pair.STACK.drafter,  # and the same DFLASH2_REVISION (bf582e4e)
    env=RECIPE_ENV,
    env_by_nodes=ENV_BY_NODES,
    profiles=PROFILES,
    default_profile="shared",
    serve_flags=pair.STACK.serve_flags,  # --max-tokens 32768 --vision (CONFIG: MAX_TOKENS, VISION)
    api_auth="front",
    readiness_path="/v1/models",
    progress_parser="tensorfold-health",
    progress_path="/health",
    master_port=pair.MASTER_PORT,  # CONFIG: MASTER_PORT 29551 at every TP
    # NODES check_workers: TP 2, 3 or 4; two Sparks are the `tensorfold` stack's
    nodes=(3, 4),
    # the per-rank env is the plan's (every device facing a peer): fabric_layout "ports" only
    fabric_layouts=("ports",),
    fabric_env_needs={3: TP_N_NEEDS, 4: {**TP_N_NEEDS, **RING_NEEDS}},
    run_flags=pair.STACK.run_flags,
    memory=pair.STACK.memory,  # v1.10's start.sh warning; the tp4 start.sh was not read (lead)
    caches=pair.STACK.caches,
    # RESEARCH "Start order": start.sh launches workers TP-1 ... 1 over ssh, then rank 0 (A4's ring
    # and MiaAI's 3-Spark GLM-5.3 do the same)
    start_order="last-to-first",
    stop_order="together",  # the ranks live and die together (start.sh's foreground watcher)
    figures=(
        *_figures(3, README_TP3, 77.6, 146.2, 166.0, 2001.0),
        *_figures(4, README_TP4, 95.2, 163.3, 222.4, 2569.0),
    ),
    sources=(CONFIG, NODES, README_TP3, README_TP4, pair.CLI, pair.HEALTH),
)
