"""Agent, Client, Status and Event: the C API's handles as Python objects
(the native calls are tern._tern; docs/embedding.md "Python")."""
import asyncio
import dataclasses
import json
from typing import Any, List, Mapping, Optional, Tuple

from . import _tern


@dataclasses.dataclass(frozen=True)
class Status:
    """The figures a scheduler polls (tern_status; GET /status has more).
    `head_epoch`/`served_epoch` (ABI 1.3): the board epochs of HEAD and of
    the served version (docs/agent/board.md §4a; 0 until the first
    supersede). Versions are ordered as positions (epoch, version): compare
    `served_position` with `head_position`, not the bare numbers (a
    supersede opens a higher epoch with a lower number)."""
    root: bool
    relay_only: bool
    joined: bool
    head: int
    served_version: int
    held_version: int
    member_count: int
    version_count: int
    members_at_head: int
    head_epoch: int = 0
    served_epoch: int = 0

    @property
    def head_position(self) -> Tuple[int, int]:
        """(head_epoch, head)."""
        return (self.head_epoch, self.head)

    @property
    def served_position(self) -> Tuple[int, int]:
        """(served_epoch, served_version); below head_position while the
        agent serves a version a supersede withdrew, or one behind HEAD."""
        return (self.served_epoch, self.served_version)


@dataclasses.dataclass(frozen=True)
class Event:
    """One thing that happened to an agent (docs/agent/operations.md
    "Events"). `kind`: "version_published", "version_served",
    "member_joined", "member_left", "member_failed", "member_demoted".
    `changed_tensors`: for served/published versions that are not
    `all_tensors`, the tensors whose bytes changed, sorted. `epoch`: the
    board epoch of `version` (0 until the first supersede, and for
    membership events); `position` = (epoch, version) only goes up from one
    version event to the next."""
    seq: int
    at_s: float
    kind: str
    version: int
    digest: str  # "tern1:" + 64 hex digits, as `tern digest` prints it
    member: str
    slot_dir: str
    all_tensors: bool
    changed_tensors: Tuple[str, ...]
    epoch: int = 0

    @property
    def position(self) -> Tuple[int, int]:
        """(epoch, version)."""
        return (self.epoch, self.version)

    @staticmethod
    def _from(d):
        return Event(seq=int(d["seq"]), at_s=float(d.get("at_s", 0.0)), kind=str(d["kind"]),
                     version=int(d.get("version", 0)), digest=_digest(d.get("digest")),
                     member=str(d.get("member", "")), slot_dir=str(d.get("slot_dir", "")),
                     all_tensors=bool(d.get("all_tensors", False)),
                     changed_tensors=tuple(d.get("changed_tensors") or ()),
                     epoch=int(d.get("epoch", 0)))


class Events(list):
    """A list of Event from Client.wait_events, with `run`: the run of the
    agent process that answered (opaque, drawn when it started: 16 hex
    digits from this version's agents; "" from an agent older than the
    field; compare it, do not parse it). A run other than the last batch's
    means the agent restarted and its seqs began again at 1: ask again with
    after_seq 0, or the new process's first events are skipped."""
    run: str

    def __init__(self, events, run: str = ""):
        super().__init__(events)
        self.run = run


def _digest(v):
    """The digest's text form ("tern1:" + 64 hex digits of the four 64-bit
    lanes, little-endian, as `tern digest` and GET /events print it) from
    either form: the C API gives lanes, GET /events the text."""
    if v is None:
        return "tern1:" + "0" * 64
    if isinstance(v, str):
        if len(v) != 70 or not v.startswith("tern1:"):
            raise ValueError(f"digest {v[:80]!r} is not 'tern1:' and 64 hex digits")
        int(v[6:], 16)
        return v.lower()
    lanes = [int(x) for x in v]
    if len(lanes) != 4:
        raise ValueError(f"digest has {len(lanes)} lanes, not 4")
    return "tern1:" + b"".join(x.to_bytes(8, "little") for x in lanes).hex()


class _OperatorCalls:
    """A root's scheduler calls and status, in-process (Agent) or over its
    admin port (Client): both call the same native names."""

    async def publish_async(self, checkpoint: str, version: int) -> None:
        """`publish` on the event loop's default executor."""
        await asyncio.get_running_loop().run_in_executor(None, self.publish, checkpoint, version)

    def status(self) -> Status:
        return Status(**self._native.status())

    def status_json(self) -> dict:
        """GET /status's JSON (docs/agent/operations.md), parsed."""
        return json.loads(self._native.status_json())

    def drain_member(self, id: str) -> None:
        """Root: `id` relays for nobody from now on (its children move at
        once) and stays a leaf while joined; drain before taking a member
        away and its departure moves nobody. Error(NOT_FOUND): not joined."""
        self._native.drain_member(str(id))

    def remove_member(self, id: str, rejoin_after_s: float = 60.0) -> None:
        """Root: drop `id` now (as if it had gone silent) and refuse its
        joins for `rejoin_after_s` (at most a day; 0: at once)."""
        self._native.remove_member(str(id), _timeout_ms(rejoin_after_s, 86400.0))

    def set_retention(self, keep_patches: int, keyframe_every: int) -> None:
        """Root: how many patches the board keeps, and a keyframe at least
        every `keyframe_every` versions (both >= 1), from now on."""
        self._native.set_retention(int(keep_patches), int(keyframe_every))


class Agent(_OperatorCalls):
    """A transfer agent in this process: a root (`root=True`) or a member
    (`join="HOST:PORT"`). The keyword options are tern-agent's
    (tern_agent_options in include/tern/tern.h; docs/cli.md): `listen` and
    `data_dir` are required, a member needs `trusted_keys_pem` (a list of
    PEM strings; the root's `public_key_pem()`), and the transport is
    "tcp+tls" unless `transport="tcp"` (loopback / trusted networks only).

    Starting blocks until the agent listens (a standby root with
    `board_etcd`: until it leads) with the GIL released. Use it as a context
    manager, or call `close()`: the agent's threads run until then.
    Thread safety: every method may be called from any thread at once,
    except `close()`, which must be the last call."""

    def __init__(self, **options):
        self._native = _tern.Agent(options)

    def publish(self, checkpoint: str, version: int) -> None:
        """Root: diff `checkpoint` (a .safetensors file or a directory)
        against HEAD, sign it and start feeding it as `version` (> HEAD).
        Returns once the version is durable on the board. Blocks for the
        diff (seconds for large models) with the GIL released."""
        self._native.publish(str(checkpoint), int(version))

    def publish_tensors(self, version: int, tensors: Mapping[str, Any]) -> None:
        """Root: publish `version` from tensors in this process's memory —
        no checkpoint file. `tensors` maps every tensor name of the serve
        view to a contiguous CPU torch.Tensor or NumPy array holding the
        exact bytes to serve (cast beforehand). Nothing is copied: the
        library reads the buffers in place during the call (GIL released)
        and keeps nothing after it returns. Refused with one message naming
        the tensor, before anything is published: a wrong dtype or shape
        against the served view (Error(MISMATCH)), a missing or extra
        tensor, a non-contiguous or device tensor (ValueError)."""
        entries, keep = [], []
        for name, t in tensors.items():
            entries.append(_tensor_entry(str(name), t))
            keep.append(t)  # alive until the call returns
        self._native.publish_tensors(int(version), entries)

    def public_key_pem(self) -> str:
        """Root: the public key members must trust."""
        return self._native.public_key_pem()

    @property
    def listen_address(self) -> str:
        return self._native.listen_address()

    @property
    def admin_address(self) -> str:
        """"HOST:PORT" of the admin port; "" without one."""
        return self._native.admin_address()

    def wait_events(self, after_seq: int = 0, max_events: int = 1024,
                    timeout_s: float = 0.0) -> List[Event]:
        """The events after `after_seq` (0: all the agent holds, its last
        1024), oldest first; waits up to `timeout_s` (at most 600) for the
        first, with the GIL released, and returns [] if none came. Resume
        with the last event's `seq`; a jump in seq means events were
        dropped (re-read status)."""
        return [Event._from(d) for d in
                self._native.wait_events(int(after_seq), int(max_events),
                                         _timeout_ms(timeout_s, 600.0))]

    def stop(self) -> None:
        """Leave and join the agent's threads; idempotent. Calls after it
        raise Error(UNAVAILABLE)."""
        self._native.stop()

    def close(self) -> None:
        """Stop and free the native handle (idempotent); later calls raise
        ValueError."""
        self._native.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Client(_OperatorCalls):
    """A running agent's admin port ("HOST:PORT", or "https://HOST:PORT"
    with `ca_pem`, the CA the port's certificate must chain to; None: the
    system's; `cert_pem`/`key_pem`: our certificate for a port that
    requires one, an agent's `admin_tls_client_ca_pem`): publish through a root,
    read status, metrics, publish jobs and events. `token`: the agent's
    admin token (needed to publish and for events when it has one).
    `supersede`: each publish is a supersede (the recovery from a wrong
    version number: a version below HEAD opens the next board epoch;
    docs/agent/operations.md).
    `timeout_s`: per request; a publish waits this long in all (default
    600). Nothing is connected until a call. Thread safety: any thread."""

    def __init__(self, address: str, *, token: Optional[str] = None, timeout_s: float = 600.0,
                 force: bool = False, ca_pem: Optional[str] = None,
                 cert_pem: Optional[str] = None, key_pem: Optional[str] = None,
                 supersede: bool = False):
        self.address = address
        self._native = _tern.Client(address, token, _timeout_ms(timeout_s, 3600.0), bool(force),
                                    ca_pem, cert_pem, key_pem, bool(supersede))

    def publish(self, checkpoint: str, version: int) -> None:
        """POST /publish: the root reads `checkpoint` (a path *it* can read)
        and publishes `version`; returns when it is on the board. Raises
        Error(TIMEOUT) if the timeout passed first (the root may still
        publish it: look at `publish_jobs()`)."""
        self._native.publish(str(checkpoint), int(version))

    def metrics(self) -> str:
        """GET /metrics: Prometheus text."""
        return self._native.metrics()

    def publish_jobs(self) -> dict:
        """GET /publish: the root's recent publish jobs."""
        return json.loads(self._native.publish_jobs_json())

    def events(self, after_seq: int = 0, max_events: int = 256, timeout_s: float = 0.0) -> dict:
        """GET /events, parsed: {"events": [Event...], "gap", "restarted",
        "next", "last_seq", "run"}. Waits up to `timeout_s` (at most 5: the port's
        bound) for the first event; resume with after_seq = "next"."""
        d = json.loads(self._native.events_json(int(after_seq), int(max_events),
                                                _timeout_ms(timeout_s, 5.0)))
        d["events"] = [Event._from(e) for e in d.get("events", [])]
        return d

    def wait_events(self, after_seq: int = 0, max_events: int = 1024,
                    timeout_s: float = 0.0) -> "Events":
        """As Agent.wait_events, over the admin port: the events after
        `after_seq` (one beyond the agent's newest, as from before it
        restarted, counts as 0), oldest first; waits up to `timeout_s` (at
        most 600, as long polls of at most 5 s) for the first, with the GIL
        released, and returns an empty list if none came. Resume with the
        last event's `seq` while the result's `run` stays the same (an
        Events list: a new run is a restarted agent, read it from 0). An
        event of a kind this library does not know (a newer agent) has kind
        "unknown". Raises Error(PROTOCOL) for a reply that is not the
        events' JSON."""
        events, run = self._native.wait_events(int(after_seq), int(max_events),
                                               _timeout_ms(timeout_s, 600.0))
        return Events([Event._from(d) for d in events], run)


class Publisher:
    """One trainer rank publishing the tensors, or row shards of tensors,
    it owns to the root behind `board` (its admin address, "HOST:PORT" or
    "https://HOST:PORT" with `ca_pem`, and `cert_pem`/`key_pem` when its
    port requires a client certificate; `token`: its admin token). The root
    commits a version once each of the `world_size` ranks sent its part
    (docs/agent/board.md §4b); full weights never travel.

    `layout` maps every tensor name of the served view to its dtype and
    shape: a tensor or array (only .dtype and .shape are read, so a
    meta-device tensor will do) or a (dtype, shape) pair (dtype a
    safetensors name such as "BF16", or a torch/NumPy dtype). It is the
    same on every rank. `shards` maps each tensor this rank owns to the
    rows it owns, (first_row, end_row) of the tensor's first dimension
    (the whole tensor: (0, shape[0]); a scalar has one row); all ranks'
    rows together cover every tensor once.

    The first version of an empty board starts from zeros. A rank that
    restarts cannot publish on top of a board it did not publish from (the
    root refuses: Error(MISMATCH)) until its new Publisher holds HEAD's
    bytes: `rebase()` fetches them from the root between versions, and
    `resume(version, tensors)` fetches them and sends the part of a version
    the root is still gathering.

    Thread safety: calls are serialized (one publish at a time)."""

    def __init__(self, *, rank: int, world_size: int, board: str, layout: Mapping[str, Any],
                 shards: Mapping[str, Tuple[int, int]], token: Optional[str] = None,
                 ca_pem: Optional[str] = None, timeout_s: float = 600.0,
                 gather_timeout_s: float = 60.0, segment_elements: int = 0,
                 cert_pem: Optional[str] = None, key_pem: Optional[str] = None):
        self.rank, self.world_size, self.board = int(rank), int(world_size), board
        self._layout = {}
        for name, t in layout.items():
            if isinstance(t, tuple) and len(t) == 2:
                dtype, shape = t
                dtype = str(dtype).replace("torch.", "")
                dtype = _DTYPES.get(dtype, dtype)
            else:
                dtype = str(t.dtype).replace("torch.", "")
                dtype = _DTYPES.get(dtype, dtype.upper() if type(t).__module__.startswith("numpy") else dtype)
                shape = t.shape
            self._layout[str(name)] = (dtype, [int(d) for d in shape])
        self._ranges = {}
        for name, (r0, r1) in shards.items():
            name = str(name)
            if name not in self._layout:
                raise ValueError(f"Publisher: shard of {name!r}, which the layout lacks")
            shape = self._layout[name][1]
            row = 1
            for d in shape[1:]:
                row *= d
            rows = shape[0] if shape else 1
            if not (0 <= int(r0) < int(r1) <= rows):
                raise ValueError(f"Publisher: rows [{r0}, {r1}) of {name!r}, which has {rows}")
            self._ranges[name] = (int(r0) * row, (int(r1) - int(r0)) * row)
        self._native = _tern.RankPublisher(
            self.rank, self.world_size, [(n, d, s) for n, (d, s) in self._layout.items()],
            [(n, f, c) for n, (f, c) in self._ranges.items()], int(segment_elements),
            _timeout_ms(gather_timeout_s, 600.0), board, token, _timeout_ms(timeout_s, 3600.0),
            ca_pem, cert_pem, key_pem)

    def publish(self, version: int, tensors: Mapping[str, Any]) -> int:
        """Sends this rank's part of `version`: `tensors` maps each tensor
        it owns to a contiguous CPU torch.Tensor or NumPy array holding its
        rows' serve-view bytes (cast beforehand). Read in place, nothing
        copied before the diff (GIL released). Returns once the version is
        on the board — after every rank sent its part and the root
        committed — with the part's size on the wire in bytes; raises
        tern.Error with the root's code and reason otherwise (a rank that
        did not send is named; TIMEOUT: the outcome is not known yet)."""
        entries = self._entries("publish", tensors)
        return self._native.publish(int(version), entries)

    def rebase(self) -> int:
        """On a new Publisher (one that has published nothing) of a rank
        whose process restarted between versions: fetches this rank's rows
        of HEAD from the root (its admin port, with the token; in pieces of
        at most 8 MiB, each copied into the previous view as it arrives) and returns
        HEAD, 0 on an empty board. Then `publish` the next version as
        usual. Error(MISMATCH) on a Publisher that has published, or when
        HEAD kept moving while the rows were fetched; Error(UNAVAILABLE)
        when the root serves another version than HEAD (it took the board
        over and has published nothing since: `resume` with a base read
        from a member). A failure leaves the Publisher as it was."""
        return self._native.rebase()

    def resume(self, version: int, tensors: Mapping[str, Any], *,
               base_version: Optional[int] = None,
               base: Optional[Mapping[str, Any]] = None) -> int:
        """After this rank's process restarted while the root was gathering
        `version`: sends its part again, from a new Publisher (one that has
        published nothing). `tensors` are the rows' bytes of `version` now,
        as for `publish`. The base, this rank's rows as of HEAD, is fetched
        from the root as `rebase` does when neither `base_version` nor
        `base` is given; or `base` maps each owned tensor to its rows as of
        `base_version`, the board's HEAD, read from a view that serves it
        (a member's served slot, e.g. `tern.Subscriber(...).next().tensor`
        sliced to the rows; on an empty board `base_version=0, base=None`).
        The root takes the part only into its open gathering of `version`;
        Error(MISMATCH) when it refuses (the version committed or failed,
        this rank's part is there already, another base), its message
        saying what to do; nothing is taken then, and the Publisher holds
        the base. Returns the part's size once the version is on the
        board."""
        entries = self._entries("resume", tensors)
        if base_version is None:
            if base is not None:
                raise ValueError("Publisher.resume: a base needs its base_version")
            return self._native.resume_from_root(int(version), entries)
        if base is None:
            if base_version != 0:
                raise ValueError("Publisher.resume: base is None only with base_version=0 "
                                 "(or neither, to fetch the base from the root)")
            before = []
        else:
            before = self._entries("resume", base)
        return self._native.resume(int(base_version), before, int(version), entries)

    def _entries(self, call: str, tensors: Mapping[str, Any]) -> list:
        """(name, first, count, address, bytes) per owned tensor; the
        buffers must stay alive until the native call returns (the caller's
        mapping holds them)."""
        if set(map(str, tensors)) != set(self._ranges):
            raise ValueError(f"Publisher.{call}: want exactly the owned tensors "
                             f"{sorted(self._ranges)}, got {sorted(map(str, tensors))}")
        entries = []
        for name, t in tensors.items():
            first, count = self._ranges[str(name)]
            _, _, _, ptr, nbytes = _tensor_entry(str(name), t)
            entries.append((str(name), first, count, ptr, nbytes))
        return entries

    @property
    def version(self) -> int:
        """The last version this rank's part was committed in (0: none)."""
        return self._native.version()


_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8",
    "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
}


def _tensor_entry(name: str, t, who: str = "publish_tensors") -> tuple:
    """(name, safetensors dtype, shape, address, bytes) of a contiguous CPU
    buffer, without copying it. `who` prefixes errors."""
    kind = type(t).__module__.split(".")[0]
    if kind == "torch":
        if t.device.type != "cpu" or not t.is_contiguous():
            raise ValueError(f"{who}: {name!r} must be a contiguous CPU tensor")
        dtype = str(t.dtype).replace("torch.", "")
        return (name, _DTYPES.get(dtype, dtype), list(t.shape), t.data_ptr(),
                t.numel() * t.element_size())
    if kind == "numpy" or hasattr(t, "__array_interface__"):
        import numpy as np
        a = t if isinstance(t, np.ndarray) else np.asarray(t)
        if not a.flags.c_contiguous:
            raise ValueError(f"{who}: {name!r} must be a C-contiguous array")
        dtype = str(a.dtype)
        return (name, _DTYPES.get(dtype, dtype.upper()), list(a.shape),
                a.__array_interface__["data"][0], a.nbytes)
    raise ValueError(f"{who}: {name!r} is a {type(t).__name__}, not a tensor or array")


def view_digest(tensors: Mapping[str, Any]) -> str:
    """D(view) of a whole serve view held in this process's memory
    ("tern1:" + 64 hex digits, the form Version.digest and `tern digest`
    use): `tensors` maps every tensor name of the view to a contiguous CPU
    torch.Tensor or NumPy array, read in place (GIL released). Equal to a
    version's digest, which the root's signed manifest binds, exactly when
    the tensors are that version bit for bit (docs/format/patch.md
    "Digest"; a checksum: authenticity comes from the signature)."""
    entries, keep = [], []
    for name, t in tensors.items():
        entries.append(_tensor_entry(str(name), t, "view_digest"))
        keep.append(t)  # alive until the call returns
    return _digest(_tern.view_digest(entries))


def _timeout_ms(seconds: float, most: float) -> int:
    if seconds is None or seconds < 0:
        raise ValueError("a timeout must be >= 0 seconds")
    return int(min(float(seconds), most) * 1000)


def version() -> str:
    """tern's release."""
    return _tern.version()


def abi_version() -> Tuple[int, int]:
    """(major, minor) of the loaded libtern."""
    v = _tern.abi_version()
    return (v >> 16, v & 0xFFFF)
