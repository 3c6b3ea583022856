// tern_relay_blob: baseline (c) of bench/fanout, a PULSE-style patch carried
// through tern's own tree. The agent carries only tern's patch and keyframe
// objects, so this harness runs the same relay (agent/relay RelayNode: push
// window, windows, cut-through, SHA-256 per chunk against a signed manifest)
// over the same transport (TLS, 8 streams by default) with the tree the
// agent's root planned for the same testbed, and gives it another object:
// PulseEncode's patch of each version (bench/baselines/pulse.h). A serving
// node then applies it with PulseApply and checks the view's digest.
//
//   tern_relay_blob encode --out DIR CKPT1 CKPT2 ...
//       writes DIR/pulse-V.bin (CKPT(V-1) -> CKPT(V), V = 2..N) and prints
//       one JSON line per version: bytes and the new view's digest.
//   tern_relay_blob node --id ID --listen HOST:PORT [--parent HOST:PORT]
//       --children K --dir DIR [--root] [--base CKPT --expect D2,D3,...]
//       [transport flags as tern-agent's]
//       prints "ready" once its parent link and K children are up; the root
//       then reads "offer V FILE" lines on stdin and prints "offered V T";
//       every node prints "held V T" as the object completes and, with
//       --base, "applied V T ok|bad" after PulseApply and the digest check.
//       Version 1 is a warm-up object of any bytes (held, never applied):
//       the agents' tree carried its keyframe first.
//       T: Unix time in seconds (one clock: every node runs on this host).
//       It exits when its stdin closes.
//
// A bench tool, not a product: every node signs and trusts one key derived
// from a fixed seed (the processes share this machine), and a node keeps
// one view in memory.
#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "agent/board/publish.h"
#include "agent/manifest/object_ref.h"
#include "agent/relay/relay.h"
#include "bench/baselines/pulse.h"
#include "tern/checkpoint.h"
#include "tern/digest.h"
#include "tern/env.h"
#include "tern/thread_pool.h"
#include "tern/version_manifest.h"
#include "tools/transport_flags.h"

namespace tern {
namespace {

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string DigestHex(const ViewDigest& d) {
  char buf[80];
  std::snprintf(
      buf, sizeof buf, "%016llx%016llx%016llx%016llx", static_cast<unsigned long long>(d.lanes[0]),
      static_cast<unsigned long long>(d.lanes[1]), static_cast<unsigned long long>(d.lanes[2]),
      static_cast<unsigned long long>(d.lanes[3]));
  return buf;
}

// One line to stdout at a time (the relay's worker, the apply thread, main).
std::mutex out_mu;
void Say(const std::string& line) {
  std::lock_guard<std::mutex> lock(out_mu);
  std::cout << line << std::endl;
}

Status Encode(const std::string& out_dir, const std::vector<std::string>& ckpts) {
  TERN_REQUIRE(ckpts.size() >= 2, kInvalidArgument, "encode needs two checkpoints or more");
  ThreadPool pool(2);
  TERN_ASSIGN_OR_RETURN(auto prev, Checkpoint::Open(ckpts[0]));
  for (size_t i = 1; i < ckpts.size(); ++i) {
    TERN_ASSIGN_OR_RETURN(auto next, Checkpoint::Open(ckpts[i]));
    TERN_ASSIGN_OR_RETURN(auto patch, bench::PulseEncode(prev->view(), next->view()));
    const uint64_t version = i + 1;
    const std::string path = out_dir + "/pulse-" + std::to_string(version) + ".bin";
    TERN_RETURN_IF_ERROR(WriteNewFile(DefaultEnv(), path, patch));
    Say("{\"version\": " + std::to_string(version) +
        ", \"bytes\": " + std::to_string(patch.size()) + ", \"digest\": \"" +
        DigestHex(ComputeDigest(next->view(), pool)) + "\", \"path\": \"" + path + "\"}");
    prev = std::move(next);
  }
  return Status::Ok();
}

struct NodeArgs {
  std::string id, listen, parent, dir, base;
  std::vector<std::string> expect;  // digests of versions 2, 3, ...
  uint32_t children = 0;
  bool root = false;
  cli::TransportArgs transport;
};

// The view a serving node applies onto: its own copy of the base checkpoint.
struct OwnedView {
  std::vector<TensorDesc> descs;
  std::vector<std::vector<uint8_t>> bytes;
  MutableServeView view;
};

Result<std::unique_ptr<OwnedView>> LoadView(const std::string& path) {
  TERN_ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(path));
  auto v = std::make_unique<OwnedView>();
  v->descs = ckpt->tensors();
  for (size_t i = 0; i < v->descs.size(); ++i) {
    const TensorRef& t = ckpt->view().tensors[i];
    v->bytes.emplace_back(t.data, t.data + t.desc->bytes());
  }
  for (size_t i = 0; i < v->descs.size(); ++i)
    v->view.tensors.push_back({&v->descs[i], v->bytes[i].data()});
  return v;
}

Status RunNode(const NodeArgs& a) {
  Env& env = DefaultEnv();
  TERN_ASSIGN_OR_RETURN(TcpOptions topt, cli::TransportOptions(a.transport));
  TERN_ASSIGN_OR_RETURN(auto transport, cli::MakeTransport(a.transport, topt));
  std::array<uint8_t, 32> seed;
  seed.fill(0x5c);
  TERN_ASSIGN_OR_RETURN(ManifestSigner signer, ManifestSigner::FromSeed(seed));
  ManifestVerifier verifier;
  TERN_RETURN_IF_ERROR(verifier.AddTrustedKey(signer.public_key()));
  BoardId board;
  board.fill(0xc0);
  std::unique_ptr<OwnedView> view;
  if (!a.base.empty()) {
    TERN_ASSIGN_OR_RETURN(view, LoadView(a.base));
  }
  ThreadPool pool(2);

  // Completed objects go to one apply thread, in order (each PULSE patch
  // applies to the previous version).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<uint64_t, std::string>> todo;
  bool done = false;
  std::thread applier([&] {
    for (;;) {
      std::pair<uint64_t, std::string> job;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return done || !todo.empty(); });
        if (todo.empty()) return;
        job = std::move(todo.front());
        todo.pop_front();
      }
      std::string patch;
      Status st = ReadFileToString(env, job.second, uint64_t{1} << 34, &patch);
      if (st.ok())
        st = bench::PulseApply({reinterpret_cast<const uint8_t*>(patch.data()), patch.size()},
                               view->view);
      bool ok = st.ok();
      const size_t k = job.first - 2;
      if (ok)
        ok = k < a.expect.size() &&
             DigestHex(ComputeDigest(AsConst(view->view), pool)) == a.expect[k];
      char line[96];
      std::snprintf(line, sizeof line, "applied %llu %.6f %s",
                    static_cast<unsigned long long>(job.first), UnixNow(), ok ? "ok" : "bad");
      Say(line);
      if (!st.ok()) Say("error " + st.ToString());
    }
  });
  // Joined on every way out (an error return too), after the relay below is
  // gone: it is declared later, so destroyed first, and calls nothing after.
  struct Joiner {
    std::function<void()> stop;
    ~Joiner() { stop(); }
  } joiner{[&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_one();
    }
    if (applier.joinable()) applier.join();
  }};

  agent::RelayOptions options;
  options.member_id = a.id;
  agent::RelayCallbacks cb;
  cb.on_object_complete = [&](const agent::ObjectRef& ref, const std::string& path) {
    char line[64];
    std::snprintf(line, sizeof line, "held %llu %.6f", static_cast<unsigned long long>(ref.to),
                  UnixNow());
    Say(line);
    if (view && ref.to >= 2) {  // version 1: the warm-up object, not a patch
      std::lock_guard<std::mutex> lock(mu);
      todo.emplace_back(ref.to, path);
      cv.notify_one();
    }
  };
  // A dial that failed (one of 8 streams' SYNs lost on a lossy link leaves
  // the connection half-open, and it is dropped) is made again, as the
  // agent's member does, 200 ms later.
  std::atomic<bool> redial{false};
  cb.on_parent_failed = [&](uint32_t, const Status& why, agent::ParentLoss) {
    Say("parent-failed " + why.ToString());
    redial = true;
  };
  TERN_RETURN_IF_ERROR(CreateDirs(env, a.dir));
  agent::RelayNode relay(
      *transport, env, a.dir, verifier, board,
      [](std::string_view line) {  // the relay's own log, to this node's log file
        std::lock_guard<std::mutex> lock(out_mu);
        std::cerr << line << std::endl;
      },
      options, cb);
  TERN_RETURN_IF_ERROR(relay.Listen(a.listen));
  if (!a.parent.empty()) relay.SetParent(0, 1, a.parent);
  std::atomic<bool> stopping{false};
  std::thread redialer([&] {
    while (!stopping) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (redial.exchange(false) && !stopping) relay.SetParent(0, 1, a.parent);
    }
  });
  struct Stop {
    std::atomic<bool>& stopping;
    std::thread& t;
    ~Stop() {
      stopping = true;
      t.join();
    }
  } stop{stopping, redialer};
  // Ready: the parent link and every child subscribed (a link's peer is set
  // by SUBSCRIBE on the parent's side, at the dial on the child's).
  for (int i = 0;; ++i) {
    uint32_t kids = 0;
    bool parent_up = a.parent.empty();
    for (const agent::LinkStats& l : relay.Stats()) {
      if (l.parent)
        parent_up = true;
      else if (!l.peer.empty())
        ++kids;
    }
    if (parent_up && kids >= a.children) break;
    TERN_REQUIRE(i < 60000, kTimeout, "node ", a.id, ": ", kids, " of ", a.children,
                 " children and ", parent_up ? "a" : "no", " parent link after 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  Say("ready");
  std::string line;
  while (std::getline(std::cin, line)) {
    if (!a.root || line.rfind("offer ", 0) != 0) continue;
    const size_t sp = line.find(' ', 6);
    TERN_REQUIRE(sp != std::string::npos, kInvalidArgument, "offer V FILE, not '", line, "'");
    const uint64_t version = std::stoull(line.substr(6, sp - 6));
    const std::string path = line.substr(sp + 1);
    const agent::ObjectRef ref{ObjectKind::kPatch, version - 1, version};
    std::string data;
    TERN_ASSIGN_OR_RETURN(uint64_t bytes, env.FileSize(path));
    TERN_RETURN_IF_ERROR(ReadFileToString(env, path, bytes, &data));
    // The agent's own description of an object (chunking and hashes).
    TERN_ASSIGN_OR_RETURN(
        ManifestObject object,
        agent::DescribeObject(ref, {reinterpret_cast<const uint8_t*>(data.data()), data.size()},
                              agent::DefaultChunkBytes(bytes), pool));
    VersionManifest m;
    m.board_id = board;
    m.version = version;
    m.parent = version - 1;
    m.objects.push_back(object);
    TERN_ASSIGN_OR_RETURN(std::string signed_manifest, signer.Sign(m));
    const double t = UnixNow();
    TERN_RETURN_IF_ERROR(relay.Offer(std::move(signed_manifest), ref, path));
    char out[64];
    std::snprintf(out, sizeof out, "offered %llu %.6f", static_cast<unsigned long long>(version),
                  t);
    Say(out);
  }
  return Status::Ok();
}

int Main(int argc, char** argv) {
  CLI::App app{
      "tern_relay_blob: a PULSE patch through tern's relay tree (bench/fanout baseline c)"};
  app.require_subcommand(1);
  std::string out_dir;
  std::vector<std::string> ckpts;
  auto* enc = app.add_subcommand("encode", "PULSE patches of consecutive checkpoints");
  enc->add_option("--out", out_dir, "directory for pulse-V.bin")->required();
  enc->add_option("checkpoints", ckpts, "CKPT1 CKPT2 ... in version order")->required();
  NodeArgs n;
  std::string expect;
  auto* node = app.add_subcommand("node", "one node of the tree");
  node->add_option("--id", n.id, "member id (sent in SUBSCRIBE)")->required();
  node->add_option("--listen", n.listen, "HOST:PORT for children")->required();
  node->add_option("--parent", n.parent, "the parent's HOST:PORT (none: the root)");
  node->add_option("--children", n.children, "children to wait for before saying ready");
  node->add_option("--dir", n.dir, "where received objects go")->required();
  node->add_flag("--root", n.root, "offer what stdin names");
  node->add_option("--base", n.base, "apply each version onto this checkpoint (a serving node)");
  node->add_option("--expect", expect,
                   "the digests of versions 2, 3, ... (encode's), comma-separated");
  cli::AddTransportFlags(*node, n.transport);
  CLI11_PARSE(app, argc, argv);
  Status st;
  if (*enc) {
    st = Encode(out_dir, ckpts);
  } else {
    n.expect = cli::CommaList(expect);
    st = RunNode(n);
  }
  if (!st.ok()) {
    std::cerr << "tern_relay_blob: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tern

int main(int argc, char** argv) { return tern::Main(argc, argv); }
