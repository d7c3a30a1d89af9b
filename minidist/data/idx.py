"""Read and write IDX files, the format of MNIST and Fashion-MNIST (``train-images-idx3-ubyte``).

    images = read_idx("data/train-images-idx3-ubyte.gz")     # uint8 (60000, 28, 28)
    write_idx("tiny-idx1-ubyte", np.arange(10, dtype=np.uint8))

Layout (all integers big-endian; http://yann.lecun.com/exdb/mnist/)::

    byte 0   1   2          3        4 .. 4+4*ndim          then prod(dims) items
        [0] [0] [dtype code] [ndim]  [dim 0][dim 1]...(u32)  [data, row-major, big-endian]

    dtype codes: 0x08 uint8, 0x09 int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64

Gzip is recognised by content (bytes 1f 8b), whatever the file name says. A bad magic number or
a truncated file raises ``ValueError`` naming the file and the expected vs actual byte counts.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
CODES = {np.dtype(v).newbyteorder("=").str: k for k, v in DTYPES.items()}


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError) as e:  # a truncated .gz raises EOFError
            raise ValueError(f"read_idx: {path} is a gzip file that cannot be decompressed ({e}); "
                             "it is probably truncated. Download it again.") from e
    return raw


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (plain or gzip) into a native-endian NumPy array.

    Args:
        path: the file.

    Returns:
        The array, shaped by the file's dimensions (uint8 for MNIST).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: bad magic number, unknown dtype code, or fewer bytes than the header declares.
    """
    path = Path(path)
    raw = _read_bytes(path)
    if len(raw) < 4:
        raise ValueError(f"read_idx: {path} has {len(raw)} bytes, fewer than the 4-byte IDX magic "
                         "number. The file is truncated or not an IDX file.")
    zero0, zero1, code, ndim = raw[0], raw[1], raw[2], raw[3]
    if zero0 != 0 or zero1 != 0 or code not in DTYPES:
        raise ValueError(f"read_idx: {path} does not start with an IDX magic number: got bytes "
                         f"{raw[:4].hex(' ')}, expected 00 00 <dtype code in "
                         f"{[hex(c) for c in DTYPES]}> <ndim>. Is it an MNIST-style IDX file?")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"read_idx: {path} is truncated: its header declares {ndim} dimensions "
                         f"({header} header bytes) but the file has {len(raw)} bytes.")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(DTYPES[code])
    expected = header + int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) < expected:
        raise ValueError(f"read_idx: {path} is truncated: shape {dims} of {dtype.name} needs "
                         f"{expected} bytes but the file has {len(raw)} (decompressed). "
                         "Download it again.")
    data = np.frombuffer(raw, dtype=dtype, count=int(np.prod(dims, dtype=np.int64)), offset=header)
    return data.reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path: str | os.PathLike, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file; gzip-compressed when the name ends with ``.gz``.

    Raises:
        ValueError: the dtype has no IDX code (use uint8, int8, int16, int32, float32, float64).
    """
    array = np.asarray(array)
    key = array.dtype.newbyteorder("=").str
    if key not in CODES:
        raise ValueError(f"write_idx: dtype {array.dtype} has no IDX code; convert the array to "
                         "one of uint8, int8, int16, int32, float32, float64.")
    code = CODES[key]
    body = struct.pack(f">BBBB{array.ndim}I", 0, 0, code, array.ndim, *array.shape)
    body += array.astype(DTYPES[code]).tobytes()
    path = Path(path)
    if path.name.endswith(".gz"):
        body = gzip.compress(body)
    path.write_bytes(body)
