"""Torch-free checkpoint images for tests of the file format, persistence and the writer."""

from __future__ import annotations

import mmap
from typing import Any

from ecrl.contract.ckptfile import FOOTER_SIZE, encode_prefix, plan_layout


def make_image(step: int, payload: bytes = b"", meta: dict[str, Any] | None = None
               ) -> tuple[mmap.mmap, int]:
    """An image whose one 'tensor' is ``payload`` (default: bytes derived from ``step``);
    ``meta`` adds header fields."""
    data = payload or bytes((step * 7 + i) % 251 for i in range(1000 + step))
    entries = [{"dtype": "uint8", "shape": [len(data)], "nbytes": len(data)}]
    layout = plan_layout(meta={"global_step": step, **(meta or {})}, tensors=entries,
                         tree={"$tensor": 0})
    image = mmap.mmap(-1, layout.size + FOOTER_SIZE)
    encode_prefix(layout, memoryview(image))
    start = layout.data_start + entries[0]["offset"]
    image[start : start + len(data)] = data
    return image, layout.size
