"""The checkpoint file format: sealed, verified on read, every defect a one-line error."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt_images import make_image

from ecrl.contract.ckptfile import FOOTER_SIZE, CheckpointError, checksum_of, read_verified, seal


def _sealed(tmp_path: Path, step: int = 3) -> tuple[Path, str]:
    image, size = make_image(step)
    checksum = seal(memoryview(image), size)
    path = tmp_path / "c.ckpt"
    path.write_bytes(image[: size + FOOTER_SIZE])
    return path, checksum


def test_round_trip(tmp_path: Path) -> None:
    path, checksum = _sealed(tmp_path)
    ckpt = read_verified(path, expected_checksum=checksum)
    assert ckpt.checksum == checksum == checksum_of(path)
    assert checksum.startswith("sha256:") and len(checksum) == 7 + 64
    assert ckpt.meta == {"global_step": 3}
    entry = ckpt.header["tensors"][0]
    start = ckpt.data_start + entry["offset"]
    assert bytes(ckpt.data[start : start + entry["nbytes"]]) == bytes(
        (3 * 7 + i) % 251 for i in range(1003))
    assert ckpt.data_start % 64 == 0


@pytest.mark.parametrize("where", [0, 20, -100, -FOOTER_SIZE - 1, -1])
def test_any_flipped_byte_is_caught(tmp_path: Path, where: int) -> None:
    path, checksum = _sealed(tmp_path)
    data = bytearray(path.read_bytes())
    data[where] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError) as info:
        read_verified(path, expected_checksum=checksum)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_truncated_missing_and_foreign_files(tmp_path: Path) -> None:
    path, _ = _sealed(tmp_path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"checksum footer|truncated|mismatch"):
        read_verified(path)
    with pytest.raises(CheckpointError, match="missing"):
        read_verified(tmp_path / "nope.ckpt")
    other = tmp_path / "other.ckpt"
    other.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match="not an ECRL checkpoint"):
        read_verified(other)


def test_checksum_must_match_latest(tmp_path: Path) -> None:
    _, checksum = _sealed(tmp_path, step=3)
    (tmp_path / "x").mkdir()
    other, other_checksum = _sealed(tmp_path / "x", step=4)
    assert other_checksum != checksum
    # a whole, valid checkpoint that is not the one latest.json recorded is refused too
    with pytest.raises(CheckpointError, match=r"recorded in latest\.json"):
        read_verified(other, expected_checksum=checksum)
