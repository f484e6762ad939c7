"""Where sparkrig puts things on a host: every path the phases, units and templates share."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sparkhost import rankenv

from sparkrig import hostpkg
from sparkrig.config.model import Settings


def revision_dir(weights_dir: str, name: str, commit: str) -> str:
    """Where one revision of an artifact lives: ``<weights_dir>/<name>-<commit>``."""
    return f"{weights_dir.rstrip('/')}/{name}-{commit}"


@dataclass(frozen=True)
class HostPaths:
    """Every path the phases, units and templates share on one host (``paths``)."""

    bin_dir: str
    host_package: str
    env_file: str  # rank.env (files/sparkhost/rankenv.py)
    token_file: str
    pair_token: str
    api_key: str
    api_key_env: str
    # the head's record of every base image it pulled by digest (uninstall.py removes them)
    pulled_images: str
    agent_unit: str
    watchdog_unit: str
    supervisor_unit: str
    run_dir: str
    gid_env: str
    restart_script: str
    model_dir: str
    # a stack with no drafter has no drafter directory ("": nothing uses it then)
    drafter_dir: str
    rank_unit: str
    pair_unit: str
    gpu_clock_unit: str

    def by_name(self) -> dict[str, str]:
        """Every path under its field's name (the templates' context: sparkrig/render.py)."""
        return asdict(self)


def paths(s: Settings) -> HostPaths:
    k = s.knobs
    return HostPaths(
        bin_dir=f"{k.install_dir}/bin",
        host_package=hostpkg.remote_dir(k.install_dir),
        env_file=rankenv.path(k.config_dir),
        token_file=f"{k.config_dir}/hf-token",
        pair_token=f"{k.config_dir}/pair-token",
        api_key=f"{k.config_dir}/api-key",
        api_key_env=f"{k.config_dir}/api-key.env",
        pulled_images=f"{k.config_dir}/pulled-images",
        agent_unit="/etc/systemd/system/sparkrig-agent.service",
        watchdog_unit="/etc/systemd/system/sparkrig-watchdog.service",
        supervisor_unit="/etc/systemd/system/sparkrig-supervisor.service",
        run_dir="/run/sparkrig",
        gid_env=rankenv.HANDED_PATH,
        restart_script=f"{k.install_dir}/bin/sparkrig-restart-pair",
        model_dir=revision_dir(k.weights_dir, "model", s.model.revision),
        drafter_dir=revision_dir(k.weights_dir, "drafter", s.drafter.revision) if s.drafter else "",
        rank_unit=f"/etc/systemd/system/{s.unit_name}.service",
        pair_unit="/etc/systemd/system/sparkrig-pair.service",
        gpu_clock_unit="/etc/systemd/system/sparkrig-gpu-clock.service",
    )
