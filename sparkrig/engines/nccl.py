"""A ring rank's NCCL graph files, built from the fabric plan in the format of MiaAI's generator
(scripts/nodes.sh ``graph_xml`` at 14a5e91c, stored copy id 71619227959). NCCL reads them, so
every engine family that runs on a ring hands out the same files (``Engine.graph_files``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sparkrig import fabricenv, topology


def graph_xml(devices: Sequence[str], toward: Sequence[str], comm_rank: int, channels: int = 4
              ) -> str:  # fmt: skip
    """One NCCL graph file as MiaAI's ``graph_xml`` writes it: ``channels`` ring channels, each
    listening on a device toward the peer (the devices ``toward`` it in turn), numbered by its
    place in ``devices`` (NCCL_IB_HCA's list), the GPU at rank ``comm_rank`` of the
    communicator; the ring and its split pattern (ids 0 and 1), three empty graphs after."""
    if not toward:
        raise ValueError("no RoCE device toward the peer")
    lines = ['<graphs version="1">']
    channel = []
    for k in range(channels):
        d = toward[k % len(toward)]
        idx = max((n for n, name in enumerate(devices) if name == d), default=-1)
        channel.append(
            f'    <channel><net dev="{idx}"/><gpu dev="0" rank="{comm_rank}"/>'
            f'<net dev="{idx}"/></channel>'
        )
    for gid, pattern in ((0, 4), (1, 3)):
        lines.append(
            f'  <graph id="{gid}" pattern="{pattern}" crossnic="1" nchannels="{channels}" '
            'speedintra="12" speedinter="12" latencyinter="0" typeintra="LOC" typeinter="P2C" '
            'samechannels="1">'
        )
        lines += channel
        lines.append("  </graph>")
    for gid, pattern in ((4, 6), (2, 3), (3, 5)):
        lines.append(
            f'  <graph id="{gid}" pattern="{pattern}" crossnic="0" nchannels="0" speedintra="0" '
            'speedinter="0" latencyinter="0" typeintra="LOC" typeinter="LOC" samechannels="0"/>'
        )
    lines.append("</graphs>")
    return "\n".join(lines) + "\n"


def ring_graph_files(plan: topology.Plan, rank: int, channels: int = 4) -> Mapping[str, str]:
    """A ring rank's three NCCL graph files by their container path (``fabricenv.GRAPH_FILE``,
    ``fabricenv.RING_GRAPHS``), as MiaAI's ``ring_graphs``: the ring (this rank's own rank,
    listening toward the previous rank), and patch 0076's two-rank links to the previous rank
    (this rank is the link's rank 1) and to the next (its rank 0). Only a ring of four and more
    has them (a triangle's every peer is on a cable of its own)."""
    if not plan.relays:
        raise ValueError(f"a plan of {plan.nnodes} ranks is no ring: it has no graph files")
    part = plan.ranks[rank]
    n = plan.nnodes
    prev, nxt = (rank - 1) % n, (rank + 1) % n

    def toward(peer: int) -> list[str]:
        return [i.rdma for i in part.facing(peer)]

    devices = part.rdma_devices
    link_prev, link_next = fabricenv.RING_GRAPHS
    return {
        fabricenv.GRAPH_FILE: graph_xml(devices, toward(prev), rank, channels),
        link_prev: graph_xml(devices, toward(prev), 1, channels),
        link_next: graph_xml(devices, toward(nxt), 0, channels),
    }
