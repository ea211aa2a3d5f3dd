"""Types of the compiled semantics kernels (``ecrl/contract/_native.c``)."""

import numpy as np
import numpy.typing as npt

def feistel(keys: npt.NDArray[np.uint64], low_bits: int, low_mask: int, high_mask: int,
            limit: int, positions: npt.NDArray[np.uint64], out: npt.NDArray[np.int64]) -> None: ...
def row_hashes(rows: npt.NDArray[np.int64], out: npt.NDArray[np.uint64]) -> None: ...
