"""A member's served slot as the engine reads it for one update: the
safetensors headers (validated, bounded), the tensors an update names, and
which engine module each checkpoint tensor feeds.

Pure Python over the file system and torch; no vLLM import, so that the
rules here are tested without an engine (tests/engine/test_tern_vllm.py).

A slot is a checkpoint directory (docs/agent.md, "Local apply": DIR/views/a
or b, DIR/current links to the served one): `model.safetensors`, or shards
listed by `model.safetensors.index.json`. Every file an update reads is
inside the slot, and every slot inside the root the engine was given at
init (the member's DIR): a request cannot make the engine read elsewhere.
"""
import json
import os
import struct
from dataclasses import dataclass

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# safetensors' own bound on a header.
HEADER_BYTES_MAX = 100 << 20
INDEX_BYTES_MAX = 64 << 20
FILES_MAX = 4096
TENSORS_MAX = 1 << 20
NAME_BYTES_MAX = 1024
DIMS_MAX = 8

# safetensors dtype -> bytes per element.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}


class SlotError(ValueError):
    """Bad input: an update info, a slot or a file that does not fit. The
    message names the path or tensor; nothing has been loaded."""


@dataclass(frozen=True)
class TensorEntry:
    file: str          # absolute path of the safetensors file
    dtype: str         # safetensors dtype name
    shape: tuple
    begin: int         # byte offsets in the file's data section
    end: int


def inside(path, root):
    """True if `path` (resolved) is `root` (resolved) or below it."""
    path, root = os.path.realpath(path), os.path.realpath(root)
    return os.path.commonpath([path, root]) == root


def _plain_file_name(name, where):
    if (not isinstance(name, str) or not name or len(name) > 255 or "/" in name
            or "\\" in name or name in (".", "..") or "\0" in name):
        raise SlotError(f"{where}: {name!r} is not a plain file name")
    return name


def read_header(path):
    """name -> TensorEntry for one safetensors file, every entry checked
    against the file: a known dtype, a shape of non-negative ints, offsets
    inside the data section whose length is numel * element size."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise SlotError(f"{path}: shorter than a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > HEADER_BYTES_MAX or 8 + n > size:
                raise SlotError(f"{path}: header length {n} does not fit the file ({size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise SlotError(f"{path}: {e.strerror or e}") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SlotError(f"{path}: header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise SlotError(f"{path}: header is not a JSON object")
    if len(header) > TENSORS_MAX + 1:
        raise SlotError(f"{path}: {len(header)} tensors (at most {TENSORS_MAX})")
    data_bytes = size - 8 - n
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name[:80]!r}"
        if len(name.encode()) > NAME_BYTES_MAX:
            raise SlotError(f"{where}: name longer than {NAME_BYTES_MAX} bytes")
        if not isinstance(v, dict) or set(v) != {"dtype", "shape", "data_offsets"}:
            raise SlotError(f"{where}: entry must have exactly dtype, shape, data_offsets")
        dtype, shape, offs = v["dtype"], v["shape"], v["data_offsets"]
        if dtype not in DTYPE_BYTES:
            raise SlotError(f"{where}: unknown dtype {dtype!r}")
        if (not isinstance(shape, list) or len(shape) > DIMS_MAX
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 48
                           for d in shape)):
            raise SlotError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise SlotError(f"{where}: bad data_offsets {offs!r}")
        numel = 1
        for d in shape:
            numel *= d
        begin, end = offs
        if not 0 <= begin <= end <= data_bytes or end - begin != numel * DTYPE_BYTES[dtype]:
            raise SlotError(f"{where}: data_offsets {offs} do not hold {dtype}{shape} inside "
                            f"the file's {data_bytes} data bytes")
        out[name] = TensorEntry(path, dtype, tuple(shape), begin, end)
    return out


def read_slot(slot):
    """name -> TensorEntry over every tensor file of checkpoint dir `slot`."""
    if not os.path.isdir(slot):
        raise SlotError(f"{slot}: not a directory")
    index = os.path.join(slot, INDEX_FILE)
    if os.path.exists(index):
        try:
            if os.path.getsize(index) > INDEX_BYTES_MAX:
                raise SlotError(f"{index}: larger than {INDEX_BYTES_MAX} bytes")
            with open(index, "rb") as f:
                weight_map = json.loads(f.read()).get("weight_map")
        except (OSError, ValueError, AttributeError) as e:
            raise SlotError(f"{index}: not a readable index ({e})") from None
        if not isinstance(weight_map, dict) or len(weight_map) > TENSORS_MAX:
            raise SlotError(f"{index}: weight_map must be an object of at most {TENSORS_MAX} names")
        files = sorted({_plain_file_name(v, index) for v in weight_map.values()})
    else:
        weight_map = None
        files = [SINGLE_FILE]
    if len(files) > FILES_MAX:
        raise SlotError(f"{slot}: {len(files)} tensor files (at most {FILES_MAX})")
    out = {}
    for name in files:
        path = os.path.join(slot, name)
        if not os.path.isfile(path):
            raise SlotError(f"{path}: missing (the slot lists it)" if weight_map is not None
                            else f"{slot}: neither {SINGLE_FILE} nor {INDEX_FILE}")
        if not inside(path, slot):
            raise SlotError(f"{path}: resolves outside the slot")
        for tensor, entry in read_header(path).items():
            if tensor in out:
                raise SlotError(f"{slot}: tensor {tensor!r} in two files")
            out[tensor] = entry
    if weight_map is not None:
        for tensor, name in weight_map.items():
            entry = out.get(tensor)
            if entry is None or os.path.basename(entry.file) != name:
                raise SlotError(f"{index}: {tensor!r} is not in {name}")
        out = {k: v for k, v in out.items() if k in weight_map}
    return out


def module_key(name, packed):
    """The engine module a checkpoint tensor feeds: its parent module, with a
    fused shard (q_proj, gate_proj, ...) renamed to the module the engine
    fuses it into (`packed`: vLLM's packed_modules_mapping, fused -> shards).
    Two tensors with one key are loaded together or not at all."""
    module, _, _ = name.rpartition(".")
    parent, _, leaf = module.rpartition(".")
    for fused, shards in packed.items():
        if leaf in shards:
            return f"{parent}.{fused}" if parent else fused
    return module


def plan_groups(schema, changed, packed):
    """(keys, names): the engine modules an update touches and every
    checkpoint tensor they need, in the schema's order. A changed q_proj
    brings k_proj and v_proj (one fused qkv_proj), a changed gate_proj its
    up_proj: the engine reloads a fused module whole."""
    keys = {module_key(n, packed) for n in changed}
    names = [n for n in schema if module_key(n, packed) in keys]
    return sorted(keys), names


@dataclass(frozen=True)
class Update:
    slot: str
    version: int
    changed: list | None
    base: int | None


def check_update(slot, version, changed, base, root):
    """The update info's fields, checked; raises SlotError. `root`: the
    member's directory given at init, which every slot must be inside."""
    if not isinstance(slot, str) or not slot or len(slot) > 4096 or "\0" in slot:
        raise SlotError("update_info.slot must be a non-empty path")
    if not os.path.isabs(slot):
        raise SlotError(f"update_info.slot {slot!r} must be an absolute path")
    if not inside(slot, root):
        raise SlotError(f"update_info.slot {slot!r} is outside the root {root!r} given at init")
    for field, v, optional in (("version", version, False), ("base", base, True)):
        if v is None and optional:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 64:
            raise SlotError(f"update_info.{field} must be an integer in [0, 2^64), got {v!r}")
    if changed is not None:
        if not isinstance(changed, list) or len(changed) > TENSORS_MAX:
            raise SlotError(f"update_info.changed must be null or a list of at most "
                            f"{TENSORS_MAX} tensor names")
        for n in changed:
            if not isinstance(n, str) or not n or len(n.encode()) > NAME_BYTES_MAX:
                raise SlotError(f"update_info.changed: {str(n)[:80]!r} is not a tensor name")
        if len(set(changed)) != len(changed):
            raise SlotError("update_info.changed names a tensor twice")
    return Update(os.path.realpath(slot), version, changed, base)


def check_against_schema(slot_entries, schema, names, slot):
    """Every tensor in `names` is in the schema (what the engine loaded) and
    in the slot with the schema's dtype and shape."""
    for n in names:
        want = schema.get(n)
        if want is None:
            raise SlotError(f"unknown tensor {n!r}: the engine's checkpoint has no such tensor")
        got = slot_entries.get(n)
        if got is None:
            raise SlotError(f"{slot}: tensor {n!r} is missing")
        if got.dtype != want.dtype or got.shape != want.shape:
            raise SlotError(f"{slot}: tensor {n!r} is {got.dtype}{list(got.shape)}, the engine "
                            f"serves {want.dtype}{list(want.shape)}")
