"""Types of the compiled scan kernel (``verifier/_native.c``, which says what each function
proves)."""

import numpy as np
import numpy.typing as npt

def prove_block(block: npt.NDArray[np.uint8], ends: npt.NDArray[np.int64],
                pieces: tuple[bytes, bytes, bytes, bytes, bytes], steps: npt.NDArray[np.int64],
                epochs: npt.NDArray[np.int64], cursors: npt.NDArray[np.int64],
                hashes: npt.NDArray[np.uint64], ids: npt.NDArray[np.int64] | None,
                out: npt.NDArray[np.uint8]) -> tuple[int, bool] | None: ...
def number_columns(rest: npt.NDArray[np.uint8], n: int, segments: tuple[bytes, ...]
                   ) -> bytes | None: ...
