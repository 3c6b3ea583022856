"""A small independent safetensors reader and writer for the Python tests
(numpy arrays in, numpy arrays out), written from the format, not from tern.

Tensors are {name: (dtype string, shape tuple, numpy array)}; F8 and 16-bit
float tensors are carried as unsigned integers of their width (bit patterns).
"""
import json
import struct

import numpy as np

NP = {"F32": np.float32, "BF16": np.uint16, "F16": np.uint16, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8,
      "U8": np.uint8, "I32": np.int32, "I64": np.int64}


def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> (dtype string, shape, array); metadata: __metadata__
    (default {"format": "pt"})."""
    header = {"__metadata__": metadata if metadata is not None else {"format": "pt"}}
    blobs, offset = [], 0
    for name, (dt, shape, arr) in tensors.items():
        b = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((-len(h)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    """name -> (dtype string, shape tuple, array of that shape, a copy)."""
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + a:8 + n + b], dtype=NP[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], tuple(info["shape"]), arr.copy())
    return out


def f32_tensors(arrays):
    """{name: float32 array} -> the tensors form write_safetensors takes."""
    return {name: ("F32", a.shape, a) for name, a in arrays.items()}
