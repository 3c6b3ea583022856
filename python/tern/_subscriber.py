"""The engine side: each version a member serves, as tensors to load.

A Subscriber follows an agent's events (in this process, or over its admin
port) and yields a Version for each newly served version. A Version reads
its tensors from the member's served slot (docs/agent/apply.md: DIR/current
points at it; it stays as it is while served), and either hands them out
whole (`tensor`), as sparse updates against what the caller holds
(`updates`), or writes them into the caller's tensors in place
(`apply_to`), bit for bit, then checks the slot was served throughout.

Reading goes through the safetensors library (its bounds and checks);
PyTorch tensors when torch imports, NumPy arrays otherwise.
"""
import json
import os
from typing import Dict, Iterator, List, Mapping, MutableMapping, Optional, Tuple, Union

from ._core import _DTYPES, Agent, Client, view_digest
from ._errors import Code, Error

try:
    import torch
except ImportError:  # NumPy only
    torch = None
import numpy as np

_SINGLE = "model.safetensors"
_INDEX = "model.safetensors.index.json"
_INDEX_BYTES_MAX = 64 << 20


def _error(code: Code, what: str) -> Error:
    name = code.name.lower().replace("_", " ")
    return Error(code, name, f"{name}: {what}")


class Version:
    """One served version. `changed_tensors`: the tensors whose bytes
    changed since the version this subscriber yielded before (all of them
    when `all_tensors`: the first version, a keyframe, or events missed).
    `epoch`: its board epoch; `position` = (epoch, version) names it (a
    supersede renumbers below a withdrawn HEAD, docs/agent/board.md §4a)."""

    def __init__(self, subscriber, version: int, digest: str, slot_dir: str, all_tensors: bool,
                 changed: Tuple[str, ...], epoch: int = 0):
        self._subscriber = subscriber
        self.version = version
        self.epoch = epoch
        self.digest = digest
        self.slot_dir = slot_dir
        self.all_tensors = all_tensors
        self.changed_tensors = changed
        self._files: Optional[Dict[str, str]] = None

    @property
    def position(self) -> Tuple[int, int]:
        """(epoch, version)."""
        return (self.epoch, self.version)

    def __repr__(self):
        n = "all" if self.all_tensors else len(self.changed_tensors)
        return (f"tern.Version({self.version}, epoch={self.epoch}, {self.slot_dir!r}, "
                f"changed={n})")

    # ---- reading the slot ----

    def _file_of(self) -> Dict[str, str]:
        """tensor name -> safetensors file of the slot."""
        if self._files is not None:
            return self._files
        index = os.path.join(self.slot_dir, _INDEX)
        files: Dict[str, str] = {}
        if os.path.exists(index):
            if os.path.getsize(index) > _INDEX_BYTES_MAX:
                raise _error(Code.RESOURCE_EXHAUSTED, f"{index}: larger than {_INDEX_BYTES_MAX} bytes")
            with open(index, "rb") as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict):
                raise _error(Code.CORRUPT, f"{index}: no weight_map object")
            for name, file in weight_map.items():
                if not isinstance(file, str) or "/" in file or file in ("", ".", ".."):
                    raise _error(Code.CORRUPT, f"{index}: {file!r} is not a plain file name")
                files[name] = os.path.join(self.slot_dir, file)
        else:
            from safetensors import safe_open
            path = os.path.join(self.slot_dir, _SINGLE)
            if not os.path.exists(path):
                raise _error(Code.NOT_FOUND, f"{self.slot_dir}: neither {_SINGLE} nor {_INDEX}")
            with safe_open(path, framework=_framework()) as f:
                files = {name: path for name in f.keys()}
        self._files = files
        return files

    def tensor_names(self) -> List[str]:
        """The tensors to load for this version: the changed ones, or every
        tensor of the slot when `all_tensors`."""
        if self.all_tensors:
            return sorted(self._file_of())
        return list(self.changed_tensors)

    def tensor(self, name: str):
        """Tensor `name` of this version (a torch.Tensor, or a NumPy array
        without torch), read from the slot."""
        from safetensors import safe_open
        path = self._file_of().get(name)
        if path is None:
            raise _error(Code.NOT_FOUND, f"version {self.version}: no tensor {name!r} in {self.slot_dir}")
        with safe_open(path, framework=_framework()) as f:
            return f.get_tensor(name)

    def _meta(self, name: str) -> Tuple[str, Tuple[int, ...]]:
        """(safetensors dtype, shape) of tensor `name`, from its header."""
        from safetensors import safe_open
        path = self._file_of().get(name)
        if path is None:
            raise _error(Code.NOT_FOUND, f"version {self.version}: no tensor {name!r} in {self.slot_dir}")
        with safe_open(path, framework=_framework()) as f:
            s = f.get_slice(name)
            return s.get_dtype(), tuple(s.get_shape())

    def still_served(self) -> bool:
        """Whether the member still serves this version (its slot is then
        as it was: positions (epoch, version) only move forward, so a slot
        served at the end of a read was served throughout it). Compared as
        positions: the same number in another epoch is another version."""
        return self._subscriber._served_position() == self.position

    # ---- sparse updates and in-place apply ----

    def updates(self, previous: MutableMapping) -> Iterator[Tuple[str, object, object]]:
        """(name, indices, values) per tensor: the flat element indices
        (row-major, in the tensor's own coordinates) whose bits differ
        between `previous[name]` (what the caller holds: the previous
        version) and this version, and this version's values there. A
        tensor absent from `previous` comes whole (indices of every
        element)."""
        for name in self.tensor_names():
            new = self.tensor(name)
            old = previous.get(name) if hasattr(previous, "get") else previous[name]
            if old is None:
                idx = _arange(_numel(new), new)
                yield name, idx, _flat(new)
                continue
            _check_same(name, old, new, self.version)
            idx = _changed(_flat(old), _flat(new))
            yield name, idx, _flat(new)[idx]

    def verify(self, tensors: Mapping) -> None:
        """Checks that `tensors` (name -> contiguous CPU torch.Tensor or
        NumPy array) hold this version bit for bit, against its digest — the
        one the root's signed manifest binds, which the member checked
        before serving (docs/security.md) — not against the slot. `tensors`
        must hold every tensor of the version's view (others in it are
        ignored): Error(NOT_FOUND) names one it lacks. Error(MISMATCH) when
        the digest differs. Reads every byte once (GIL released)."""
        view = self._file_of()
        missing = [n for n in sorted(view) if n not in tensors]
        if missing:
            raise _error(Code.NOT_FOUND, f"verify: version {self.version}'s view has {len(view)} "
                                         f"tensors; the tensors given lack {missing[0]!r}"
                                         + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
        got = view_digest({n: tensors[n] for n in view})
        if got != self.digest:
            raise _error(Code.MISMATCH, f"verify: the tensors' digest {got} is not version "
                                        f"{self.version}'s signed digest {self.digest}")

    def apply_to(self, tensors: MutableMapping, *, verify_digest: Optional[bool] = None) -> int:
        """Writes this version into `tensors` (name -> torch.Tensor or NumPy
        array, contiguous, holding the previous version) in place: only the
        elements whose bits differ are written. Every named tensor is checked
        (present, same dtype and shape) before anything is written. After
        writing, each tensor is compared bit for bit with the slot, and the
        slot must still be served (else Error(UNAVAILABLE): the member moved
        on while this read; the subscriber's next version then carries every
        tensor). Then, with `verify_digest` (None: when `tensors` holds every
        tensor of the view, each a contiguous CPU tensor or array; True:
        required, refused before anything is written), `verify(tensors)`:
        the whole view against the
        version's signed digest (Error(MISMATCH) if it differs, e.g. a
        tensor the caller changed that this version did not). Returns the
        number of elements written."""
        view = self._file_of()
        if verify_digest is None:
            # Only a whole view in host memory can be hashed here.
            verify_digest = all(n in tensors and _hashable(tensors[n]) for n in view)
        elif verify_digest:
            for n in sorted(view):  # refused before anything is written
                if n not in tensors:
                    raise _error(Code.NOT_FOUND, f"apply_to: verify_digest needs every tensor of "
                                                 f"version {self.version}'s view; {n!r} is not given")
                if not _hashable(tensors[n]):
                    raise _error(Code.INVALID_ARGUMENT, f"apply_to: verify_digest: {n!r} is not a "
                                                        "contiguous CPU tensor or array")
        names = self.tensor_names()
        for name in names:
            if name not in tensors:
                raise _error(Code.NOT_FOUND, f"apply_to: version {self.version} changes {name!r}, "
                                             "which the tensors given do not have")
            _check_writable(name, tensors[name])
            dtype, shape = self._meta(name)
            held = tensors[name]
            if _dtype_name(held) != dtype or tuple(held.shape) != shape:
                raise _error(Code.MISMATCH, f"apply_to: {name!r} is {_describe(held)} here, "
                                            f"{dtype}{list(shape)} in version {self.version}")
        written = 0
        for name in names:
            new = self.tensor(name)
            dst = tensors[name]
            _check_same(name, dst, new, self.version)
            d, n = _flat(dst), _flat(new)
            idx = _changed(d, n)
            if len(idx):
                d[idx] = n[idx]
                written += len(idx)
            if len(_changed(d, n)):
                raise _error(Code.MISMATCH, f"apply_to: {name!r} differs from version {self.version} "
                                            "after the write")
        if not self.still_served():
            self._subscriber._resync = True
            raise _error(Code.UNAVAILABLE, f"apply_to: the member moved past version {self.version} "
                                           "while it was read; apply the next version (it carries "
                                           "every tensor)")
        if verify_digest:
            try:
                self.verify(tensors)
            except Error:
                self._subscriber._resync = True  # the next version rewrites every tensor
                raise
        return written


class Subscriber:
    """Follows the versions an agent serves. `agent`: an in-process
    tern.Agent (member or root), a tern.Client, or an admin address
    "HOST:PORT" (with `token` when the agent has one).

    `next(timeout_s)` returns the newest served version not yet returned
    (several served since the last call are coalesced into one whose
    `changed_tensors` is their union: the older slots may already be
    rewritten), or None when none came within the timeout. Iterating blocks
    for each next version; `async for` does the same on the default
    executor. Not thread-safe: one consumer per Subscriber."""

    def __init__(self, agent: Union[Agent, Client, str], *, token: Optional[str] = None,
                 after_seq: int = 0):
        if isinstance(agent, str):
            agent = Client(agent, token=token)
        if not isinstance(agent, (Agent, Client)):
            raise TypeError("agent must be a tern.Agent, a tern.Client or an admin address")
        self._agent = agent
        self._after = int(after_seq)
        self._resync = True  # the first version carries every tensor
        self._changed: set = set()
        self._latest = None  # the newest served event not yet returned
        self._run = ""  # the agent process's run, over an admin port
        self._backoff_s = 0.1  # before polling an agent that could not be reached again

    def _served_position(self) -> Tuple[int, int]:
        return self._agent.status().served_position

    def _poll(self, timeout_s: float) -> None:
        if isinstance(self._agent, Agent):
            events = self._agent.wait_events(self._after, 1024, timeout_s)
            if events and self._after and events[0].seq != self._after + 1:
                self._resync = True  # dropped from the ring, or the agent restarted
        else:
            try:
                d = self._agent.events(self._after, 1024, min(timeout_s, 5.0))
            except Error as e:
                if e.code not in (Code.UNAVAILABLE, Code.TIMEOUT):
                    raise
                # The agent cannot be reached (a restart, a cut, its
                # listeners busy): no events this time, after a backoff
                # from 0.1 s doubling to 2 s, within the caller's timeout.
                import time
                time.sleep(min(self._backoff_s, max(timeout_s, 0.0)))
                self._backoff_s = min(self._backoff_s * 2, 2.0)
                return
            self._backoff_s = 0.1
            run = d.get("run") or ""
            if run and self._run and run != self._run and self._after:
                # A new agent process whose seqs began again, perhaps
                # already past ours: read it from its first event.
                d = self._agent.events(0, 1024, 0.0)
                self._resync = True
            self._run = run or self._run
            events = d["events"]
            if d.get("gap") or d.get("restarted"):
                self._resync = True
            self._after = int(d.get("next", self._after))
        if events and isinstance(self._agent, Agent):
            self._after = events[-1].seq
        for e in events:
            if e.kind != "version_served":
                continue
            if e.all_tensors:
                self._resync = True
            self._changed.update(e.changed_tensors)
            self._latest = e

    def next(self, timeout_s: Optional[float] = None) -> Optional[Version]:
        """The next served version, waiting up to `timeout_s` (None: for
        ever)."""
        import time
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            left = 5.0 if deadline is None else max(0.0, deadline - time.monotonic())
            self._poll(min(left, 5.0))
            if self._latest is not None:
                # Drain what else is already there, so the newest comes out.
                self._poll(0.0)
                e, self._latest = self._latest, None
                v = Version(self, e.version, e.digest, e.slot_dir, self._resync,
                            tuple(sorted(self._changed)), e.epoch)
                self._resync = False
                self._changed = set()
                return v
            if deadline is not None and time.monotonic() >= deadline:
                return None

    def __iter__(self) -> Iterator[Version]:
        while True:
            yield self.next(None)

    def __aiter__(self):
        return self

    async def __anext__(self) -> Version:
        import asyncio
        loop = asyncio.get_running_loop()
        while True:
            v = await loop.run_in_executor(None, self.next, 5.0)
            if v is not None:
                return v


# ---- tensors of either kind ----

def _framework() -> str:
    return "pt" if torch is not None else "numpy"


def _is_torch(t) -> bool:
    return torch is not None and isinstance(t, torch.Tensor)


def _numel(t) -> int:
    return t.numel() if _is_torch(t) else int(t.size)


def _flat(t):
    """A flat view of t's elements (no copy; t must be contiguous)."""
    return t.reshape(-1) if _is_torch(t) else t.reshape(-1)


def _bits(flat):
    """The elements' bits as integers of the same width (so NaNs, -0.0 and
    every float8 or bfloat16 pattern compare by bits)."""
    if _is_torch(flat):
        ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
        return flat.view(ints[flat.element_size()])
    ints = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
    return flat.view(ints[flat.dtype.itemsize])


def _changed(old_flat, new_flat):
    if _is_torch(new_flat):
        return torch.nonzero(_bits(old_flat) != _bits(new_flat), as_tuple=False).reshape(-1)
    return np.flatnonzero(_bits(old_flat) != _bits(new_flat))


def _arange(n, like):
    return torch.arange(n) if _is_torch(like) else np.arange(n)




def _dtype_name(t) -> str:
    """The safetensors name of t's dtype (torch.bfloat16 -> "BF16")."""
    name = str(t.dtype).replace("torch.", "")
    return _DTYPES.get(name, name.upper())


def _describe(t) -> str:
    return f"{t.dtype}{list(t.shape)}"


def _check_same(name, held, new, version):
    if _is_torch(new) != _is_torch(held):
        raise _error(Code.INVALID_ARGUMENT, f"{name!r}: give {'torch tensors' if _is_torch(new) else 'NumPy arrays'}")
    if held.dtype != new.dtype or tuple(held.shape) != tuple(new.shape):
        raise _error(Code.MISMATCH, f"{name!r} is {_describe(held)} here, {_describe(new)} in "
                                    f"version {version}")


def _hashable(t) -> bool:
    """Whether view_digest can read `t` in place: a contiguous CPU tensor or
    a C-contiguous NumPy array."""
    if _is_torch(t):
        return t.device.type == "cpu" and t.is_contiguous()
    return isinstance(t, np.ndarray) and t.flags.c_contiguous


def _check_writable(name, t):
    if _is_torch(t):
        if t.device.type != "cpu" or not t.is_contiguous():
            raise _error(Code.INVALID_ARGUMENT, f"apply_to: {name!r} must be a contiguous CPU tensor")
    elif isinstance(t, np.ndarray):
        if not t.flags.c_contiguous or not t.flags.writeable:
            raise _error(Code.INVALID_ARGUMENT, f"apply_to: {name!r} must be a contiguous writable array")
    else:
        raise _error(Code.INVALID_ARGUMENT, f"apply_to: {name!r} is a {type(t).__name__}, not a tensor")
