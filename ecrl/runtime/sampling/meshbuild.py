"""The ``DeviceMesh`` of this attempt, from the run's parallelism settings (``ecrl.init_mesh``).

``ecrl run --parallel fsdp|hsdp [--replicate R] [--tp T]`` builds its ranks' mesh here, and a
user's script under ``ecrl launch`` gets the same one the same way: the launch passes the settings
the user gave it to the ranks (``ECRL_PARALLEL``, ``ECRL_REPLICATE``, ``ECRL_TP``,
:mod:`ecrl.runtime.launchenv`), with the usual precedence (docs/library.md): a setting given to the
launch > the script's own argument > the default. The shape at this attempt's world size is
:func:`ecrl.runtime.meshplan.mesh_of`'s; the dimensions are named ``dp`` (fsdp) or
``dp_replicate``, ``dp_shard`` (hsdp), then ``tp``, the names :mod:`ecrl.runtime.sampling.mesh`
reads coordinates from, so the mesh can be handed to the sampler and the step log as it is.
"""

from __future__ import annotations

from typing import Any

from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.meshplan import MeshLayout, mesh_of
from ecrl.runtime.settings import SUPERVISOR_DEFAULTS

__all__ = ["mesh_layout", "init_mesh", "data_parallel_mesh"]


def mesh_layout(*, parallel: str | None = None, replicate: int | None = None,
                tp: int | None = None, world_size: int | None = None) -> MeshLayout:
    """This attempt's layout: each setting from the launch (when given), else the argument,
    else the default; ``world_size`` defaults to torch.distributed's."""
    env = AttemptEnv.from_environ()
    given = env.mesh if env is not None else {}

    def pick(name: str, script: Any) -> Any:
        if given.get(name) is not None:
            return given[name]
        return script if script is not None else getattr(SUPERVISOR_DEFAULTS, name)

    if world_size is None:
        import torch.distributed as dist

        world_size = dist.get_world_size() if dist.is_initialized() else 1
    first = env.world_sizes[0] if env is not None and env.world_sizes else world_size
    return mesh_of(parallel=pick("parallel", parallel), replicate=pick("replicate", replicate),
                   tp=pick("tp", tp), first_world=first, world_size=world_size)


def init_mesh(device_type: str, *, parallel: str | None = None, replicate: int | None = None,
              tp: int | None = None) -> Any:
    """The ``DeviceMesh`` of this rank's attempt (``torch.distributed`` initialised first), or
    None under ``ddp`` (no mesh: every rank a data-parallel rank). See the module docstring for
    where the settings come from."""
    layout = mesh_layout(parallel=parallel, replicate=replicate, tp=tp)
    dims = layout.dims()
    if not dims:
        return None
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, tuple(n for _, n in dims),
                            mesh_dim_names=tuple(name for name, _ in dims))


def data_parallel_mesh(mesh: Any) -> Any:
    """The data-parallel part of a mesh from :func:`init_mesh`: what ``fully_shard`` shards (and,
    2-D, replicates) over."""
    names = tuple(n for n in mesh.mesh_dim_names if n != "tp")
    return mesh if names == tuple(mesh.mesh_dim_names) else mesh[names if len(names) > 1
                                                                  else names[0]]
