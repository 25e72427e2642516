"""Start-up checks of a parallel layout, before any weight loads (the gate calls them).

What they refuse, each with a ConfigError naming the values: a world (tp x pp ranks per replica,
times dp replicas) that this node's devices cannot hold, --nnodes not dividing the ranks, a
--node-rank outside --nnodes, a --dist-init-addr port that is already taken on this node, and
--distributed-executor-backend ray without Ray installed. Whether tp and ep divide the model's
heads and experts needs the model's config: ``infer.core.model.layers.shard.check_model_split``.
"""

from __future__ import annotations

import importlib.util
import socket
from typing import Any

from infer.core.config.flags import ConfigError


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_parallel_setup(args: Any, platform: Any) -> None:
    tp, pp, dp = args.tp_size or 1, args.pp_size or 1, args.dp_size or 1
    nnodes, node_rank = args.nnodes or 1, args.node_rank or 0
    for name, v in (("--tp-size", tp), ("--pp-size", pp), ("--dp-size", dp), ("--nnodes", nnodes)):
        if v < 1:
            raise ConfigError(f"{name} {v}: must be at least 1")
    world = tp * pp
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank}: must be in 0..{nnodes - 1} (--nnodes {nnodes})")
    if world % nnodes:
        raise ConfigError(f"--nnodes {nnodes} does not divide the {world} ranks of --tp-size {tp} x "
                          f"--pp-size {pp}; use a node count that divides them")
    if nnodes > 1 and not args.dist_init_addr:
        raise ConfigError(f"--nnodes {nnodes}: give --dist-init-addr HOST:PORT (node 0's address, "
                          f"the same on every node)")
    if nnodes > 1 and dp > 1:
        raise ConfigError(f"--dp-size {dp} with --nnodes {nnodes}: data-parallel replicas run on "
                          f"one node; start one server per node instead")
    per_node = dp * world // nnodes
    slots = platform.max_local_ranks()
    if per_node > slots:
        raise ConfigError(
            f"--tp-size {tp} x --pp-size {pp} x --dp-size {dp} over --nnodes {nnodes} puts "
            f"{per_node} ranks on this node, but {platform.name} offers {slots} here "
            f"({platform.info.name}); lower the sizes or add nodes")
    if args.dist_init_addr and node_rank == 0 and world > 1:
        host, _, port = args.dist_init_addr.rpartition(":")
        if not port.isdigit():
            raise ConfigError(f"--dist-init-addr {args.dist_init_addr!r}: expected HOST:PORT")
        for p in (int(port), int(port) + 1):
            if not _port_free(host or "0.0.0.0", p):
                raise ConfigError(f"--dist-init-addr {args.dist_init_addr}: port {p} is already in "
                                  f"use on this node (the rendezvous takes PORT and PORT+1); "
                                  f"choose a free port")
    if args.distributed_executor_backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError("--distributed-executor-backend ray: Ray is not installed; install it "
                          "with pip install 'infer-core[ray]' (or use the default mp backend)")
