"""tern's weight-transfer backend for vLLM (docs/engines.md, "vLLM").

vLLM calls `register` through the `vllm.general_plugins` entry point in
every process it starts (API server, engine core, workers), sometimes more
than once per process; registering is idempotent.
"""

BACKEND = "tern"


def register():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    try:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "tern_vllm.backend", "TernWeightTransferEngine")
    except ValueError:
        # Already registered: by an earlier call in this process, or under
        # our name by someone else, which create_engine would then use.
        # Tell the two apart rather than serve the wrong backend silently.
        engine = WeightTransferEngineFactory._registry[BACKEND]()
        if engine.__module__ != "tern_vllm.backend":
            raise RuntimeError(f"weight-transfer backend {BACKEND!r} is already registered "
                               f"to {engine.__module__}.{engine.__name__}") from None
