"""RayExecutor (``--distributed-executor-backend ray``): the ranks other than rank 0 are Ray
actors, placed by a placement group (one bundle per rank, the resources
``platform.ray_resources()`` names) on the cluster the user started with ``ray start`` (found
through ``RAY_ADDRESS`` / ``ray.init(address="auto")``), or on a local Ray started here. Rank 0
stays the engine process; stepping, the step channel and fault handling are the
MultiprocExecutor's. Ray is an optional extra: ``pip install 'infer-core[ray]'``.
"""

from __future__ import annotations

import logging
from typing import Any

from infer.core.config.views import EngineConfig
from infer.core.engine.multiproc import MultiprocExecutor, _worker_main

log = logging.getLogger(__name__)


class _RankActor:
    """One rank, as a Ray actor: ``run`` serves steps until rank 0 says stop (or is gone)."""

    def run(self, cfg: EngineConfig, platform_name: str, rank: int, host: str, port: int) -> int:
        _worker_main(cfg, platform_name, rank, host, port)
        return 0


class _ActorRank:
    """A Ray actor rank behind subprocess.Popen's handle methods (poll, kill, wait, pid)."""

    def __init__(self, ray: Any, actor: Any, ref: Any) -> None:
        self.ray, self.actor, self.ref = ray, actor, ref
        self.pid = f"ray actor {actor._actor_id.hex()[:8]}"
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            done, _ = self.ray.wait([self.ref], timeout=0)
            if done:
                try:
                    self.returncode = self.ray.get(done[0])
                except Exception:  # noqa: BLE001 - the actor died or raised: a failed rank
                    self.returncode = 1
        return self.returncode

    def kill(self) -> None:
        self.ray.kill(self.actor)

    def wait(self, timeout: float | None = None) -> int | None:
        self.ray.wait([self.ref], timeout=timeout)
        return self.poll()


class RayExecutor(MultiprocExecutor):
    remote_ranks = True

    def _start_ranks(self, cfg: EngineConfig, platform: Any, host: str, port: int) -> list[Any]:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not ray.is_initialized():
            try:
                ray.init(address="auto", log_to_driver=False)
                log.info("Ray: joined the running cluster")
            except ConnectionError:
                ray.init(log_to_driver=False)
                log.info("Ray: no cluster running; started a local one")
        host = ray.util.get_node_ip_address() if cfg.parallel.dist_init_addr is None else host
        n = cfg.parallel.world_size - 1
        resources = platform.ray_resources()
        self._pg = placement_group([dict(resources) for _ in range(n)], strategy="PACK")
        ray.get(self._pg.ready(), timeout=600)
        cls = ray.remote(_RankActor)
        ranks = []
        for i in range(n):
            actor = cls.options(
                num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0),
                resources={k: v for k, v in resources.items() if k not in ("CPU", "GPU")},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._pg, placement_group_bundle_index=i)).remote()
            ranks.append(_ActorRank(ray, actor, actor.run.remote(cfg, platform.name, i + 1, host, port)))
        return ranks
