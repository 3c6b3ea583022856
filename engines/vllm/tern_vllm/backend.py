"""The `tern` weight-transfer backend: vLLM loads a new version from the
member's served slot on local disk, reading only the tensors that changed.

vLLM's contract (vllm/distributed/weight_transfer/base.py, 0.32), driven
over HTTP by the agent's engine adapter (agent/engine/) or anyone:

  POST /init_weight_transfer_engine {"init_info": {"root": DIR}}
  POST /pause?mode=keep
  POST /start_weight_update
  POST /update_weights {"update_info": {"slot": DIR/views/b, "version": 7,
                        "changed": [names] | null, "base": 6}}
  POST /finish_weight_update {"weight_version": "7"}
  POST /resume

`update_weights` validates everything before it touches the model (the
slot inside the root, every name known, every file present, dtypes and
shapes those of the checkpoint the engine loaded), then reads the tensors
it needs through safetensors' mmap, then loads them. A bad update raises a
ValueError whose message names the cause; the model still holds the
version it held.

How each engine module is loaded:
* a module with a quantization method (every linear layer, embeddings,
  lm_head) through vLLM's layerwise reload: vLLM's CPU build repacks linear
  weights after loading (oneDNN or sgl handles; the weight parameter is
  emptied), so an in-place copy would not be seen. The module is restored
  to its checkpoint layout, loaded whole, and processed again. A fused
  module (qkv_proj, gate_up_proj) is loaded whole: when q_proj changes,
  k_proj and v_proj are read from the slot too.
* any other module (norms) in place, by the model's own weight loaders.
* `changed: null`: every tensor, the whole model through layerwise reload.
"""
import logging
import os
import time
from dataclasses import dataclass

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from . import slot as slots

logger = logging.getLogger("tern_vllm")

# Starts the message of every update the backend refuses as bad input
# (agent/engine/vllm_adapter.cc looks for it).
BAD_UPDATE = "tern: bad update: "


@dataclass
class TernInitInfo(WeightTransferInitInfo):
    """root: the member's directory (tern-agent --dir); every slot an update
    names must be inside it. version: the version the engine was started
    with, if known; an update with a `base` is checked against it."""

    root: str
    version: int | None = None


@dataclass
class TernUpdateInfo(WeightTransferUpdateInfo):
    """One update: the slot that holds `version` (a checkpoint directory),
    the tensors that differ from `base` (null: all of them), and `base`, the
    version the engine must hold for `changed` to be complete."""

    slot: str
    version: int
    changed: list[str] | None = None
    base: int | None = None


class TernWeightTransferEngine(WeightTransferEngine[TernInitInfo, TernUpdateInfo]):
    init_info_cls = TernInitInfo
    update_info_cls = TernUpdateInfo

    def __init__(self, config, vllm_config, device, model) -> None:
        super().__init__(config, vllm_config, device, model)
        self._root = None      # realpath of the member's directory
        self._schema = None    # name -> TensorEntry of the checkpoint the engine loaded
        self._packed = dict(getattr(model, "packed_modules_mapping", None) or {})
        self._version = None   # the version the model holds, as far as tern knows
        self._tied = {}        # module name -> modules sharing one of its parameters
        self.last_update = {}  # timings of the last update (seconds), for logs and tests

    # -- the contract ---------------------------------------------------------

    def init_transfer_engine(self, init_info: TernInitInfo) -> None:
        root = init_info.root
        if not isinstance(root, str) or not os.path.isabs(root) or not os.path.isdir(root):
            raise ValueError(f"tern: init_info.root must be an existing absolute directory, "
                             f"got {root!r}")
        if init_info.version is not None:
            slots.check_update(root, init_info.version, None, None, root)
        model_dir = self.model_config.model
        if not os.path.isdir(model_dir):
            raise ValueError(f"tern: the engine was started from {model_dir!r}, not a local "
                             "checkpoint directory; start it from the member's DIR/current")
        # The schema every update must match: the tensors vLLM loaded at start.
        self._schema = slots.read_slot(model_dir)
        self._root = os.path.realpath(root)
        self._version = init_info.version
        self._tied = self._tied_modules()
        logger.info("tern: root %s, %d tensors in %s, version %s", self._root,
                    len(self._schema), model_dir, self._version)

    def start_weight_update(self) -> None:
        # Nothing to prepare: receive_weights validates and loads in one step
        # so that a rejected update leaves no module half-restored.
        self._require_init()

    def update_weights(self, update_info) -> None:
        # Bad input is told apart from an engine failure by this prefix
        # (vLLM answers both with HTTP 500): the agent's adapter does not
        # retry an update that starts with it.
        try:
            typed = self.parse_update_info(update_info)
            self.receive_weights(typed)
        except slots.SlotError as e:
            raise ValueError(f"{BAD_UPDATE}{e}") from None
        except ValueError as e:
            if str(e).startswith("Invalid update_info"):
                raise ValueError(f"{BAD_UPDATE}{e}") from None
            raise
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def receive_weights(self, update_info: TernUpdateInfo) -> None:
        self._require_init()
        t0 = time.perf_counter()
        u = slots.check_update(update_info.slot, update_info.version, update_info.changed,
                               update_info.base, self._root)
        if u.changed is not None and u.base is not None and u.base != self._version:
            raise slots.SlotError(f"update to version {u.version} names base {u.base}, but "
                                  f"the engine holds version {self._version}")
        entries = slots.read_slot(u.slot)
        if u.changed is None:
            keys, names = None, list(self._schema)
            missing = [n for n in self._schema if n not in entries]
            extra = [n for n in entries if n not in self._schema]
            if missing or extra:
                raise slots.SlotError(f"{u.slot}: does not hold the engine's tensors "
                                      f"(missing {missing[:3]}, unknown {extra[:3]})")
        else:
            for n in u.changed:
                if n not in self._schema:
                    raise slots.SlotError(f"unknown tensor {n!r}: the engine's checkpoint has "
                                          "no such tensor")
            keys, names = slots.plan_groups(self._schema, u.changed, self._packed)
        slots.check_against_schema(entries, self._schema, names, u.slot)
        layerwise = self._modules(keys) if keys is not None else None
        reprocess = self._partners(keys)
        t1 = time.perf_counter()
        # Read before touching the model: a read error loads nothing. Sparse
        # updates hold only the tensors of the modules they touch; a full
        # update streams (one tensor at a time, layerwise).
        if keys is not None:
            weights = self._read(entries, names)
        else:
            weights = self._stream(entries, names)
        t2 = time.perf_counter()
        self._load(weights, layerwise)
        for m in reprocess:
            # Tied to a module just reloaded: same weight, its own packed
            # copy (vLLM's CPU build packs lm_head's), made again.
            m.quant_method.process_weights_after_loading(m)
        t3 = time.perf_counter()
        self._version = u.version
        self.last_update = {"version": u.version, "tensors": len(names),
                            "modules": None if keys is None else len(keys),
                            "check_s": t1 - t0, "read_s": t2 - t1, "load_s": t3 - t2}
        logger.info("tern: version %d from %s: %d tensors (%s modules), check %.1f ms, "
                    "read %.1f ms, load %.1f ms", u.version, u.slot, len(names),
                    "all" if keys is None else len(keys), 1e3 * (t1 - t0),
                    1e3 * (t2 - t1), 1e3 * (t3 - t2))

    def finish_weight_update(self) -> None:
        self._require_init()
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    def shutdown(self) -> None:
        self._root = None
        self._schema = None

    # -- helpers --------------------------------------------------------------

    def _require_init(self):
        if self._root is None:
            raise ValueError('tern: not initialized; POST /init_weight_transfer_engine '
                             '{"init_info": {"root": "/path/to/member/dir"}} first')

    def _modules(self, keys):
        """The modules of `keys` that go through layerwise reload (those with
        a quantization method); each key must name a module of the model."""
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
        out = []
        for key in keys:
            try:
                m = self.model.get_submodule(key)
            except AttributeError:
                raise slots.SlotError(f"tensor group {key!r} maps to no module of the served "
                                      "model; send this update with changed: null") from None
            if isinstance(getattr(m, "quant_method", None), QuantizeMethodBase):
                out.append(m)
        return out

    def _tied_modules(self):
        """module name -> the other modules holding one of its parameters
        (tie_word_embeddings: embed_tokens and lm_head share a weight)."""
        holders = {}
        for name, m in self.model.named_modules():
            for p in m.parameters(recurse=False):
                holders.setdefault(id(p), []).append(name)
        tied = {}
        for names in holders.values():
            for n in names:
                tied.setdefault(n, set()).update(x for x in names if x != n)
        return {k: sorted(v) for k, v in tied.items() if v}

    def _partners(self, keys):
        """Modules to process again after the load: those tied to a module
        the update reloads (all tied ones for a full update). vLLM's
        layerwise reload processes only one of two tied modules. Only an
        unquantized partner is processed again (idempotent: it re-packs
        the shared weight); a quantized one is refused before loading."""
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
        names = set()
        for key in (self._tied if keys is None else keys):
            names.update(self._tied.get(key, ()))
        if keys is not None:
            names -= set(keys)
        out = []
        for name in sorted(names):
            m = self.model.get_submodule(name)
            qm = getattr(m, "quant_method", None)
            if not isinstance(qm, QuantizeMethodBase):
                continue  # nothing derived from the weight: sharing it is enough
            if not type(qm).__name__.startswith("Unquantized"):
                raise slots.SlotError(f"module {name!r} shares a weight with a module this "
                                      f"update reloads and is quantized ({type(qm).__name__}): "
                                      "tern cannot process it again")
            out.append(m)
        return out

    @staticmethod
    def _read(entries, names):
        from safetensors import safe_open
        by_file = {}
        for n in names:
            by_file.setdefault(entries[n].file, []).append(n)
        out = {}
        try:
            for path, file_names in by_file.items():
                with safe_open(path, framework="pt") as f:
                    for n in file_names:
                        out[n] = f.get_tensor(n)
        except Exception as e:  # safetensors raises its own error types
            raise slots.SlotError(f"reading {path}: {e}") from None
        return [(n, out[n]) for n in names]

    @staticmethod
    def _stream(entries, names):
        from safetensors import safe_open
        by_file = {}
        for n in names:
            by_file.setdefault(entries[n].file, []).append(n)
        for path, file_names in by_file.items():
            with safe_open(path, framework="pt") as f:
                for n in file_names:
                    yield n, f.get_tensor(n)

    def _load(self, weights, layerwise):
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )
        from vllm.model_executor.model_loader.reload import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )
        targets = [self.model] if layerwise is None else layerwise
        for m in targets:
            initialize_layerwise_reload(m)
        try:
            with disable_mtp_completeness_check():
                self.model.load_weights(weights)
        finally:
            # Restores any module that did not receive all its tensors to
            # what it held (vLLM keeps the kernel tensors aside).
            for m in targets:
                finalize_layerwise_reload(m, self.model_config)
