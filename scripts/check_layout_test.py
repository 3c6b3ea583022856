#!/usr/bin/env python3
"""Each rule of check_layout.py catches what it must and lets pass what it may."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layout  # noqa: E402


def kinds(path, *includes):
    text = "".join(f'#include "{i}"\n' for i in includes)
    return [p.split(": ")[2] if ": includes " in p else p.split(": ")[1]
            for p in check_layout.check_file(path, text)]


class Rules(unittest.TestCase):
    def test_backend_headers_only_from_the_registry_and_their_own_folder(self):
        self.assertEqual(kinds("tools/cmd_xfer.cc", "tern/tcp_transport.h"), ["backend"])
        self.assertEqual(kinds("agent/daemon/agent.cc", "tern/verbs_transport.h"), ["backend"])
        self.assertEqual(kinds("xfer/transfer.cc", "transport/tcp/pipe.h"), ["backend"])
        self.assertEqual(kinds("transport/connect.cc", "tern/ucx_transport.h"), ["backend"])
        self.assertEqual(kinds("transport/net/socket.cc", "transport/tcp/pipe.h"), ["backend"])
        self.assertEqual(kinds("include/tern/xfer.h", "tern/loopback_transport.h"), ["backend"])
        self.assertEqual(kinds("transport/registry/registry.cc", "tern/tcp_transport.h",
                               "tern/ucx_transport.h", "tern/verbs_transport.h",
                               "tern/loopback_transport.h"), [])
        self.assertEqual(kinds("transport/tcp/tcp.cc", "tern/tcp_transport.h", "transport/tcp/pipe.h"), [])
        # Tests, the conformance suite, fuzzers and benchmarks may.
        self.assertEqual(kinds("xfer/transfer_test.cc", "tern/tcp_transport.h"), [])
        self.assertEqual(kinds("transport/conformance_test.cc", "tern/verbs_transport.h"), [])
        self.assertEqual(kinds("xfer/fuzz_xfer.cc", "tern/loopback_transport.h"), [])
        self.assertEqual(kinds("bench/transport_bench.cc", "tern/ucx_transport.h"), [])

    def test_no_backend_includes_another(self):
        self.assertEqual(kinds("transport/verbs/verbs.cc", "transport/tcp/pipe.h"), ["sibling"])
        self.assertEqual(kinds("transport/ucx/ucx.cc", "tern/tcp_transport.h"), ["sibling"])
        # Not even a backend's test.
        self.assertEqual(kinds("transport/verbs/verbs_transport_test.cc", "transport/tcp/pipe.h"),
                         ["sibling"])
        self.assertEqual(kinds("transport/verbs/verbs.cc", "transport/net/socket.h",
                               "transport/internal.h", "transport/window_table.h"), [])

    def test_lower_layers_do_not_include_higher_ones(self):
        self.assertEqual(kinds("base/status.cc", "tern/transport.h"), ["layer"])
        self.assertEqual(kinds("base/env.cc", "patch/segment_codec.h"), ["layer"])
        self.assertEqual(kinds("transport/transport.cc", "tern/xfer.h"), ["layer"])
        self.assertEqual(kinds("transport/tcp/tcp.cc", "tern/patch.h"), ["layer"])
        self.assertEqual(kinds("xfer/transfer.cc", "tools/cli_util.h"), ["layer"])
        self.assertEqual(kinds("patch/apply.cc", "agent/daemon/agent_impl.h"), ["layer"])
        self.assertEqual(kinds("include/tern/status.h", "tern/transport.h"), ["layer"])
        # Down and sideways inside a layer are fine.
        self.assertEqual(kinds("xfer/transfer.cc", "tern/transport.h", "tern/status.h"), [])
        self.assertEqual(kinds("datagen/trace.cc", "tern/patch.h", "tern/quantize.h"), [])
        self.assertEqual(kinds("tools/cmd_xfer.cc", "tern/transport_registry.h", "tern/xfer.h"), [])

    def test_private_headers_stay_in_their_module(self):
        self.assertEqual(kinds("patch/diff.cc", "checkpoint/checkpoint_impl.h"), ["private"])
        self.assertEqual(kinds("tools/cmd_xfer.cc", "transport/internal.h"), ["private"])
        self.assertEqual(kinds("tests/cli/x_test.cc", "patch/test_util.h"), [])
        # base/'s headers are the internal floor: any module may use them.
        self.assertEqual(kinds("xfer/xfer_wire.cc", "base/coding.h"), [])
        self.assertEqual(kinds("transport/tcp/frame.cc", "base/wire_status.h"), [])

    def test_every_public_header_has_a_module(self):
        self.assertEqual(kinds("patch/apply.cc", "tern/no_such_header.h"), ["unknown"])
        self.assertEqual(kinds("include/tern/no_such_header.h"), ["unknown"])

    def test_listed_exceptions_pass_and_only_they(self):
        self.assertEqual(kinds("xfer/xfer_wire.cc", "transport/internal.h"), ["private"])
        self.assertEqual(kinds("xfer/xfer_wire.cc", "transport/window_table.h"), ["private"])
        self.assertEqual(kinds("transport/conformance_test.cc", "tern/xfer.h"), [])
        self.assertEqual(kinds("transport/connect.cc", "tern/xfer.h"), ["layer"])

    def test_the_tree_follows_the_rule(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        self.assertEqual(check_layout.main(["check_layout.py", "-q", root]), 0)


if __name__ == "__main__":
    unittest.main()
