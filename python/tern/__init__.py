"""tern: lossless, bit-exact weight patches from a trainer to its rollout
engines (docs/embedding.md "Python").

    import tern
    with tern.Agent(root=True, listen="127.0.0.1:0", data_dir="/data/root",
                    transport="tcp") as root:
        root.publish("/ckpt/step-1", 1)

    sub = tern.Subscriber("127.0.0.1:7100", token=TOKEN)   # a member's admin port
    for v in sub:
        v.apply_to(model_tensors)                           # in place, bit for bit

Every failure raises tern.Error with the C API's code (tern.Code).
Calls that block release the GIL.
"""
from ._errors import Code, Error
from ._core import Agent, Client, Event, Events, Publisher, Status, abi_version, version, view_digest
from ._subscriber import Subscriber, Version

__all__ = ["Agent", "Client", "Code", "Error", "Event", "Events", "Publisher", "Status", "Subscriber", "Version",
           "abi_version", "version", "view_digest"]
