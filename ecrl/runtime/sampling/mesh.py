"""This rank's place on a device mesh, as the sampler and the step log need it.

Under FSDP2, HSDP or tensor parallelism the data-parallel rank is not the global rank: the window
of each step is split over the data-parallel ranks and the ranks that differ only in a
tensor-parallel coordinate consume the identical shard (docs/semantics.md, "Meshes"). A script
says where it sits in one of three ways:

- the full ``DeviceMesh`` with dimension names: the dimensions named in
  :data:`SHARED_BATCH_DIMS` (``tp``, ``cp``, ``pp``) share a batch, every other dimension
  (``dp``, ``dp_replicate``, ``dp_shard``, ``replicate``, ``shard``, unnamed) splits it;
- its data-parallel sub-mesh (``mesh["dp"]``, ``mesh["dp_replicate", "dp_shard"]``, a 1-D FSDP
  mesh): every dimension of it splits the batch, and the dimensions of its root mesh named in
  :data:`SHARED_BATCH_DIMS` give the tensor-parallel coordinate;
- explicit ``dp_rank``/``dp_size`` (and ``tp_rank``/``tp_size``) for any other layout.

Several dimensions of one kind are flattened row-major (the first dimension outermost), as
``DeviceMesh._flatten`` numbers them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError, SemanticsError

__all__ = ["SHARED_BATCH_DIMS", "resolve_coords", "coords_from_mesh"]

SHARED_BATCH_DIMS = ("tp", "cp", "pp")
"""Mesh dimension names whose ranks consume the same batch (tensor, context and pipeline
parallelism); every other dimension splits the batch."""


def _flat(coord: Sequence[int], shape: Sequence[int]) -> tuple[int, int]:
    """(row-major index, size) of ``coord`` over ``shape``."""
    index = 0
    for c, n in zip(coord, shape, strict=True):
        index = index * n + c
    return index, math.prod(shape)


def coords_from_mesh(mesh: Any, *, world_size: int) -> semantics.MeshCoords:
    """This rank's :class:`~ecrl.contract.semantics.MeshCoords` on ``mesh`` (a ``DeviceMesh``,
    full or its data-parallel sub-mesh; see the module docstring)."""
    coord = mesh.get_coordinate()
    if coord is None:
        raise ConfigError("this rank is not part of the DeviceMesh given to ECRL: pass the mesh "
                          "(or data-parallel sub-mesh) this rank trains on")
    shape = tuple(int(n) for n in mesh.shape)
    names = tuple(mesh.mesh_dim_names or (None,) * len(shape))
    if math.prod(shape) == world_size:  # the full mesh: its names say which dims share
        dp = [i for i, n in enumerate(names) if n not in SHARED_BATCH_DIMS]
        tp = [i for i, n in enumerate(names) if n in SHARED_BATCH_DIMS]
        dp_rank, dp_size = _flat([coord[i] for i in dp], [shape[i] for i in dp])
        tp_rank, tp_size = _flat([coord[i] for i in tp], [shape[i] for i in tp])
    else:  # a data-parallel sub-mesh: the root mesh's shared dims give the peer coordinate
        dp_rank, dp_size = _flat(coord, shape)
        root_of = getattr(mesh, "_get_root_mesh", None)
        root = root_of() if root_of is not None else None
        root_coord = root.get_coordinate() if root is not None else None
        root_names = tuple(root.mesh_dim_names or ()) if root is not None else ()
        if root is None or root_coord is None or not root_names:
            raise ConfigError(
                f"the DeviceMesh given to ECRL has {dp_size} of the {world_size} ranks and no "
                "named root mesh to place the others: pass the full mesh with dimension names "
                "(tensor-parallel ones named tp), or dp_rank=, dp_size=, tp_rank=, tp_size=")
        root_shape = tuple(int(n) for n in root.shape)
        tp = [i for i, n in enumerate(root_names) if n in SHARED_BATCH_DIMS]
        tp_rank, tp_size = _flat([root_coord[i] for i in tp], [root_shape[i] for i in tp])
    if dp_size * tp_size != world_size:
        raise ConfigError(
            f"the DeviceMesh given to ECRL makes {dp_size} data-parallel x {tp_size} "
            f"tensor-parallel ranks, but the world has {world_size}: name the dimensions that "
            f"share a batch one of {', '.join(SHARED_BATCH_DIMS)}, or pass dp_rank=, dp_size=, "
            "tp_rank=, tp_size=")
    return semantics.MeshCoords(dp_rank=dp_rank, dp_size=dp_size, tp_rank=tp_rank,
                                tp_size=tp_size)


def resolve_coords(*, mesh: Any = None, dp_rank: int | None = None, dp_size: int | None = None,
                   tp_rank: int | None = None, tp_size: int | None = None,
                   world_size: int | None = None, owner: str) -> semantics.MeshCoords | None:
    """The mesh coordinates given to ``owner`` (a ``DeviceMesh`` or explicit ones), checked;
    None when neither was given (plain DDP). ``world_size``: the job's, when known."""
    explicit = {"dp_rank": dp_rank, "dp_size": dp_size, "tp_rank": tp_rank, "tp_size": tp_size}
    given = [k for k, v in explicit.items() if v is not None]
    if mesh is not None:
        if given:
            raise ConfigError(f"{owner}(mesh=…) and {owner}({given[0]}=…): give the DeviceMesh "
                              "or the coordinates, not both")
        if world_size is None:
            raise ConfigError(f"{owner}(mesh=…) needs torch.distributed initialised (the mesh's "
                              "world size)")
        return coords_from_mesh(mesh, world_size=world_size)
    if not given:
        return None
    if dp_rank is None or dp_size is None:
        raise ConfigError(f"{owner}({given[0]}=…): give dp_rank= and dp_size= together (and "
                          "tp_rank=, tp_size= with tensor parallelism)")
    if (tp_rank is None) != (tp_size is None):
        raise ConfigError(f"{owner}: give tp_rank= and tp_size= together")
    try:
        coords = semantics.MeshCoords(dp_rank=dp_rank, dp_size=dp_size, tp_rank=tp_rank or 0,
                                      tp_size=tp_size or 1)
    except SemanticsError as exc:
        raise ConfigError(f"{owner}: {exc}") from None
    if world_size is not None and coords.world_size != world_size:
        raise ConfigError(f"{owner}(dp_size={coords.dp_size}, tp_size={coords.tp_size}): "
                          f"DP x TP = {coords.world_size}, but the world has {world_size} ranks")
    return coords
