#!/usr/bin/env python3
"""Each rule of check_layout.py catches what it must and lets pass what it may."""
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
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
        # Down is fine.
        self.assertEqual(kinds("xfer/transfer.cc", "tern/transport.h", "tern/status.h"), [])
        self.assertEqual(kinds("datagen/trace.cc", "tern/checkpoint.h", "tern/quantize.h"), [])
        self.assertEqual(kinds("tools/cmd_xfer.cc", "tern/transport_registry.h", "tern/xfer.h"), [])

    def test_domain_modules_follow_their_order(self):
        # A checkpoint -> patch include would close a cycle (patch applies to
        # checkpoints); topology and xfer stand on their own.
        self.assertEqual(kinds("checkpoint/checkpoint.cc", "tern/patch.h"), ["layer"])
        self.assertEqual(kinds("include/tern/checkpoint.h", "tern/digest.h"), ["layer"])
        self.assertEqual(kinds("patch/diff.cc", "tern/quantize.h"), ["layer"])
        self.assertEqual(kinds("quant/cast.cc", "tern/datagen.h"), ["layer"])
        self.assertEqual(kinds("quant/cast.cc", "tern/gpu.h"), ["layer"])
        self.assertEqual(kinds("topology/planner.cc", "tern/patch.h"), ["layer"])
        self.assertEqual(kinds("xfer/transfer.cc", "tern/checkpoint.h"), ["layer"])
        self.assertEqual(kinds("patch/diff.cc", "tern/xfer.h"), ["layer"])
        self.assertEqual(kinds("format/value_code.h", "tern/patch.h"), ["layer"])
        self.assertEqual(kinds("agent/relay/relay.cc", "tern/datagen.h"), ["layer"])
        # What the code does: down the listed edges and through them.
        self.assertEqual(kinds("patch/apply_checkpoint.cc", "tern/checkpoint.h", "format/hd.h"), [])
        self.assertEqual(kinds("gpu/host/plan.cc", "tern/patch.h", "tern/quantize.h",
                               "tern/checkpoint.h"), [])
        self.assertEqual(kinds("datagen/trace_checkpoint.cc", "tern/quantize.h",
                               "tern/checkpoint.h"), [])
        self.assertEqual(kinds("agent/board/publish.cc", "tern/patch.h", "tern/transport.h"), [])
        # Tests and benchmarks beside a module may use more.
        self.assertEqual(kinds("quant/quant_bench.cc", "tern/patch.h"), [])
        self.assertEqual(kinds("datagen/quant_trace_test.cc", "tern/patch.h"), [])

    def test_the_module_order_is_acyclic(self):
        with self.assertRaisesRegex(ValueError, "cycle"):
            check_layout._closure({"base": {}, "patch": {"checkpoint": ""}, "checkpoint": {"patch": ""}})
        self.assertTrue(all(m in check_layout.MAY_USE["agent"] for m in ("base", "transport", "patch")))

    def test_rooms_follow_their_order(self):
        self.assertEqual(kinds("agent/manifest/object_ref.cc", "agent/board/board_log.h"), ["room"])
        self.assertEqual(kinds("agent/board/board.cc", "agent/etcd/etcd.h"), ["room"])
        self.assertEqual(kinds("agent/relay/relay.cc", "tern/agent.h"), ["room"])
        self.assertEqual(kinds("agent/etcd/etcd.cc", "agent/testing/etcd_test_server.h"), ["room"])
        self.assertEqual(kinds("gpu/ops/codec_ops.h", "gpu/host/plan.h"), ["room"])
        self.assertEqual(kinds("gpu/host/plan.cc", "gpu/kernels/apply_internal.h"), ["room"])
        self.assertEqual(kinds("transport/connect.cc", "tern/transport_registry.h"), ["room"])
        self.assertEqual(kinds("transport/net/socket.cc", "transport/registry/x.h"), ["room"])
        # Down is fine; the etcd board log implements board's interface.
        self.assertEqual(kinds("agent/etcd/etcd_board_log.h", "agent/board/board_log.h",
                               "tern/version_manifest.h"), [])
        self.assertEqual(kinds("agent/daemon/agent_impl.h", "agent/relay/relay.h", "agent/ops/metrics.h"), [])
        self.assertEqual(kinds("gpu/kernels/apply.cu", "gpu/host/plan.h", "gpu/ops/codec_ops.h"), [])
        self.assertEqual(kinds("transport/tcp/pipe.h", "transport/net/socket.h", "transport/internal.h"), [])
        # Tests and fixtures reach across.
        self.assertEqual(kinds("agent/etcd/etcd_test.cc", "agent/testing/etcd_test_server.h"), [])
        self.assertEqual(kinds("gpu/ops/context_ops_test.cc", "gpu/host/patch_walk.h"), [])
        # A sub-folder that is not a room must be named.
        self.assertEqual(kinds("agent/engines/x.cc"), ["unknown"])
        # The sidecar sits above ops (its admin client), below the daemon.
        self.assertEqual(kinds("agent/sidecar/x.cc", "agent/ops/admin_http.h"), [])
        self.assertEqual(kinds("agent/sidecar/x.cc", "agent/daemon/agent_impl.h"), ["room"])
        self.assertEqual(kinds("agent/daemon/x.cc", "agent/nowhere/y.h"), ["unknown"])

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

    def test_link_edges_follow_the_rule(self):
        def link_kinds(*edges, extra=()):
            libs = {
                "tern_base": ("STATIC_LIBRARY", "base", ["base/status.cc"], []),
                "tern_checkpoint": ("STATIC_LIBRARY", "checkpoint", ["checkpoint/checkpoint.cc"], []),
                "tern_patch": ("STATIC_LIBRARY", "patch", ["patch/diff.cc"], []),
                "tern_transport": ("STATIC_LIBRARY", "transport", ["transport/transport.cc"], []),
                "tern_transport_tcp": ("STATIC_LIBRARY", "transport/tcp", ["transport/tcp/tcp.cc"], []),
                "tern_transport_ucx": ("STATIC_LIBRARY", "transport/ucx", ["transport/ucx/ucx.cc"], []),
                "tern_transport_registry": ("STATIC_LIBRARY", "transport/registry",
                                            ["transport/registry/registry.cc"], []),
                "tern_xfer": ("STATIC_LIBRARY", "xfer", ["xfer/transfer.cc"], []),
                "tern_agent_manifest": ("STATIC_LIBRARY", "agent/manifest", ["agent/manifest/m.cc"], []),
                "tern_agent": ("STATIC_LIBRARY", "agent/daemon", ["agent/daemon/agent.cc"], []),
                "tern_test_certs": ("STATIC_LIBRARY", "transport", ["transport/test_certs.cc"], []),
                "tern_test_main": ("STATIC_LIBRARY", "", ["tests/support/test_main.cc"], []),
            }
            libs.update(dict(extra))
            for a, b in edges:
                libs[a][3].append(b)
            return [p.split(": ")[1] for p in check_layout.check_links(libs)]

        self.assertEqual(link_kinds(("tern_patch", "tern_checkpoint"), ("tern_agent", "tern_agent_manifest"),
                                    ("tern_transport_registry", "tern_transport_tcp"),
                                    ("tern_transport_tcp", "tern_transport"), ("tern_xfer", "tern_transport"),
                                    ("tern_test_certs", "tern_transport_tcp"),
                                    ("tern_test_main", "tern_agent"), ("tern_patch", "GTest::gtest")), [])
        self.assertEqual(link_kinds(("tern_checkpoint", "tern_patch")), ["layer"])
        self.assertEqual(link_kinds(("tern_base", "tern_transport")), ["layer"])
        self.assertEqual(link_kinds(("tern_agent_manifest", "tern_agent")), ["room"])
        self.assertEqual(link_kinds(("tern_transport", "tern_transport_registry")), ["room"])
        self.assertEqual(link_kinds(("tern_xfer", "tern_transport_tcp")), ["backend"])
        self.assertEqual(link_kinds(("tern_agent", "tern_transport_tcp")), ["backend"])
        self.assertEqual(link_kinds(("tern_transport_ucx", "tern_transport_tcp")), ["sibling"])
        self.assertEqual(link_kinds(("tern_xfer", "tern_test_certs")), ["test"])
        self.assertEqual(link_kinds(extra=[("tern_sidecar", ("STATIC_LIBRARY", "sidecar", ["sidecar/s.cc"], []))]),
                         ["unknown"])

    def test_configure_fails_on_a_planted_link_edge(self):
        # The real CMake path: cmake/TernLayout.cmake in a tiny project
        # (LANGUAGES NONE, so it configures in a fraction of a second).
        cmake = shutil.which("cmake")
        if not cmake:
            self.skipTest("cmake not found")
        repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")

        def configure(checkpoint_links):
            with tempfile.TemporaryDirectory() as tmp:
                for name, body in {
                    "CMakeLists.txt": f"""
                        cmake_minimum_required(VERSION 3.25)
                        project(planted LANGUAGES NONE)
                        set(TERN_CHECK_LAYOUT "{sys.executable}" "{repo}/scripts/check_layout.py")
                        include("{repo}/cmake/TernLayout.cmake")
                        add_subdirectory(checkpoint)
                        add_subdirectory(patch)""",
                    "checkpoint/CMakeLists.txt": f"""
                        add_library(tern_checkpoint INTERFACE)
                        tern_headers(tern_checkpoint PUBLIC)
                        target_link_libraries(tern_checkpoint INTERFACE {checkpoint_links})""",
                    "patch/CMakeLists.txt": """
                        add_library(tern_patch INTERFACE)
                        tern_headers(tern_patch PUBLIC)
                        target_link_libraries(tern_patch INTERFACE tern_checkpoint)""",
                }.items():
                    os.makedirs(os.path.dirname(os.path.join(tmp, name)), exist_ok=True)
                    with open(os.path.join(tmp, name), "w") as f:
                        f.write(textwrap.dedent(body))
                run = subprocess.run([cmake, "-S", tmp, "-B", os.path.join(tmp, "build")],
                                     capture_output=True, text=True)
                return run.returncode, run.stdout + run.stderr

        rc, out = configure("")
        self.assertEqual(rc, 0, out)
        rc, out = configure("tern_patch")  # checkpoint -> patch: a cycle
        self.assertNotEqual(rc, 0, out)
        self.assertIn("tern_checkpoint (checkpoint/) links tern_patch (patch/): layer", out)

    def test_the_tree_follows_the_rule(self):
        root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
        self.assertEqual(check_layout.main(["check_layout.py", "-q", root]), 0)


if __name__ == "__main__":
    unittest.main()
