// tern's Python module, its native half: pybind11 over libtern's C API
// (include/tern/tern.h), not over the C++ classes, so that Python sees the
// contract C callers see (the same codes, messages, bounds and thread rules)
// and the module links one shared object whose ABI is versioned.
//
// What Python gets here is deliberately thin (handles, calls, text); the
// Pythonic surface (keyword options, Status and Event records, Subscriber,
// the Error class) is tern/__init__.py, which this module imports the Error
// class from so that every failure raises tern.Error(code, code_name, text).
//
// The GIL is released around every call that can block (start, publish,
// stop, waits, the client's HTTP calls): another Python thread runs while an
// agent diffs a checkpoint or a client waits for a root. No callback into
// Python is registered with the library (logs go to stderr; events are
// polled), so no library thread ever needs the GIL and stop/free cannot
// deadlock against a Python thread.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tern/tern.h"

namespace py = pybind11;

namespace {

// Raises tern.Error for a failed call; the message is this thread's last
// error, read before anything else can call into the library.
[[noreturn]] void Raise(tern_code code) {
  std::string message = tern_last_error();
  py::object error = py::module_::import("tern._errors").attr("Error");
  py::object value = error(static_cast<int>(code), tern_code_name(code), message);
  PyErr_SetObject(error.ptr(), value.ptr());
  throw py::error_already_set();
}

void Check(tern_code code) {
  if (code != TERN_OK) Raise(code);
}

// The C API's text-out convention: ask, grow once to the size it says, ask
// again (the text may grow between the calls: a few tries).
std::string TextOut(const std::function<tern_code(char*, size_t, size_t*)>& call) {
  std::string buf(16 * 1024, '\0');
  for (int attempt = 0; attempt < 4; ++attempt) {
    size_t len = 0;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = call(buf.data(), buf.size(), &len);
    }
    if (code == TERN_OK) {
      buf.resize(len);
      return buf;
    }
    if (code == TERN_RESOURCE_EXHAUSTED && len + 1 > buf.size()) {
      buf.assign(len + 1 + len / 4, '\0');
      continue;
    }
    Raise(code);
  }
  Raise(TERN_RESOURCE_EXHAUSTED);
}

py::dict StatusDict(const tern_status& s) {
  py::dict d;
  d["root"] = s.root != 0;
  d["relay_only"] = s.relay_only != 0;
  d["joined"] = s.joined != 0;
  d["head"] = s.head;
  d["served_version"] = s.served_version;
  d["held_version"] = s.held_version;
  d["member_count"] = s.member_count;
  d["version_count"] = s.version_count;
  d["members_at_head"] = s.members_at_head;
  d["head_epoch"] = s.head_epoch;
  d["served_epoch"] = s.served_epoch;
  return d;
}

py::dict EventDict(const tern_event& e) {
  py::dict d;
  d["seq"] = e.seq;
  d["at_s"] = e.at_s;
  d["kind"] = std::string(tern_event_kind_name(e.kind));
  d["all_tensors"] = e.all_tensors != 0;
  d["version"] = e.version;
  d["epoch"] = e.epoch;
  d["digest"] = py::make_tuple(e.digest[0], e.digest[1], e.digest[2], e.digest[3]);
  d["member"] = std::string(e.member != nullptr ? e.member : "");
  d["slot_dir"] = std::string(e.slot_dir != nullptr ? e.slot_dir : "");
  py::list changed;
  for (size_t i = 0; i < e.changed_tensor_count; ++i) changed.append(std::string(e.changed_tensors[i]));
  d["changed_tensors"] = changed;
  return d;
}

// A wait's batch as a list of event dicts (the batch freed), and *run
// (when not null) its tern_events_run; raises for a failed wait.
py::list EventList(tern_code code, tern_events* batch, std::string* run = nullptr) {
  if (code != TERN_OK) {
    tern_events_free(batch);
    Raise(code);
  }
  if (run != nullptr) *run = tern_events_run(batch);
  py::list out;
  const size_t n = tern_events_count(batch);
  for (size_t i = 0; i < n; ++i) {
    tern_event e{};
    e.struct_size = sizeof e;
    if (tern_code c = tern_events_get(batch, i, &e); c != TERN_OK) {
      tern_events_free(batch);
      Raise(c);
    }
    out.append(EventDict(e));
  }
  tern_events_free(batch);
  return out;
}

// The strings tern_agent_options points at, owned for the start call.
struct OptionStrings {
  std::vector<std::string> owned;
  std::vector<std::string> keys;
  std::vector<const char*> key_ptrs;
};

// Fills `o` from keyword options (tern/__init__.py names and documents
// them); an unknown name or a wrong type is a TypeError naming it.
void FillOptions(const py::dict& kw, tern_agent_options* o, OptionStrings* s) {
  s->owned.reserve(kw.size());
  auto text = [&](const char* name, const py::handle& v) -> const char* {
    if (v.is_none()) return nullptr;
    if (!py::isinstance<py::str>(v)) throw py::type_error(std::string(name) + " must be a str");
    s->owned.push_back(v.cast<std::string>());
    return s->owned.back().c_str();
  };
  auto u32 = [&](const char* name, const py::handle& v) -> uint32_t {
    if (!py::isinstance<py::int_>(v)) throw py::type_error(std::string(name) + " must be an int");
    long long x = v.cast<long long>();
    if (x < 0 || x > 0xffffffffLL) throw py::value_error(std::string(name) + " is out of range");
    return static_cast<uint32_t>(x);
  };
  auto u64 = [&](const char* name, const py::handle& v) -> uint64_t {
    if (!py::isinstance<py::int_>(v)) throw py::type_error(std::string(name) + " must be an int");
    return v.cast<uint64_t>();
  };
  auto flag = [&](const py::handle& v) -> int {
    const int truth = PyObject_IsTrue(v.ptr());
    if (truth < 0) throw py::error_already_set();
    return truth;
  };
  auto real = [&](const char* name, const py::handle& v) -> double {
    if (!py::isinstance<py::float_>(v) && !py::isinstance<py::int_>(v))
      throw py::type_error(std::string(name) + " must be a number");
    return v.cast<double>();
  };
  for (const auto& [key_h, v] : kw) {
    const std::string key = key_h.cast<std::string>();
    const char* k = key.c_str();
    if (key == "root") o->root = flag(v);
    else if (key == "join") o->join = text(k, v);
    else if (key == "listen") o->listen = text(k, v);
    else if (key == "admin_listen") o->admin_listen = text(k, v);
    else if (key == "id") o->id = text(k, v);
    else if (key == "region") o->region = text(k, v);
    else if (key == "cluster") o->cluster = text(k, v);
    else if (key == "island") o->island = text(k, v);
    else if (key == "may_relay") o->may_relay = flag(v);
    else if (key == "relay_only") o->relay_only = flag(v);
    else if (key == "uplink_bytes_per_s") o->uplink_bytes_per_s = real(k, v);
    else if (key == "downlink_bytes_per_s") o->downlink_bytes_per_s = real(k, v);
    else if (key == "data_dir") o->data_dir = text(k, v);
    else if (key == "signing_key_pem") o->signing_key_pem = text(k, v);
    else if (key == "trusted_keys_pem") {
      if (v.is_none()) continue;
      if (py::isinstance<py::str>(v)) throw py::type_error("trusted_keys_pem must be a list of str");
      for (const auto& item : v) {
        if (!py::isinstance<py::str>(item)) throw py::type_error("trusted_keys_pem must be a list of str");
        s->keys.push_back(item.cast<std::string>());
      }
    } else if (key == "join_token") o->join_token = text(k, v);
    else if (key == "admin_token") o->admin_token = text(k, v);
    else if (key == "admin_insecure") o->admin_insecure = flag(v);
    else if (key == "admin_tls_cert_pem") o->admin_tls_cert_pem = text(k, v);
    else if (key == "admin_tls_key_pem") o->admin_tls_key_pem = text(k, v);
    else if (key == "admin_tls_client_ca_pem") o->admin_tls_client_ca_pem = text(k, v);
    else if (key == "publish_dir") o->publish_dir = text(k, v);
    else if (key == "max_version_jump") o->max_version_jump = u64(k, v);
    else if (key == "seed_checkpoint") o->seed_checkpoint = text(k, v);
    else if (key == "seed_version") o->seed_version = u64(k, v);
    else if (key == "board_etcd") o->board_etcd = text(k, v);
    else if (key == "etcd_lease_s") o->etcd_lease_s = u32(k, v);
    else if (key == "stripes") o->stripes = u32(k, v);
    else if (key == "fanout_max") o->fanout_max = u32(k, v);
    else if (key == "root_fanout_max") o->root_fanout_max = u32(k, v);
    else if (key == "keep_patches") o->keep_patches = u32(k, v);
    else if (key == "keyframe_every") o->keyframe_every = u32(k, v);
    else if (key == "segment_elements") o->segment_elements = u64(k, v);
    else if (key == "patch_format") o->patch_format = u32(k, v);
    else if (key == "heartbeat_ms") o->heartbeat_ms = u32(k, v);
    else if (key == "dead_after_ms") o->dead_after_ms = u32(k, v);
    else if (key == "spare_grace_ms") o->spare_grace_ms = u32(k, v);
    else if (key == "stream_apply") o->stream_apply = flag(v);
    else if (key == "patch_nibbles") o->patch_nibbles = flag(v);
    else if (key == "parent_stall_ms") o->parent_stall_ms = u32(k, v);
    else if (key == "relay_probation_ms") o->relay_probation_ms = u32(k, v);
    else if (key == "push_window_bytes") o->push_window_bytes = u32(k, v);
    else if (key == "threads") o->threads = u32(k, v);
    else if (key == "transport") o->transport = text(k, v);
    else if (key == "tls_cert_file") o->tls_cert_file = text(k, v);
    else if (key == "tls_key_file") o->tls_key_file = text(k, v);
    else if (key == "tls_ca_file") o->tls_ca_file = text(k, v);
    else if (key == "tls_server_name") o->tls_server_name = text(k, v);
    else throw py::type_error("unknown agent option '" + key + "'");
  }
  for (const auto& key : s->keys) s->key_ptrs.push_back(key.c_str());
  o->trusted_keys_pem = s->key_ptrs.empty() ? nullptr : s->key_ptrs.data();
  o->trusted_keys_count = s->key_ptrs.size();
}

// (name, dtype, shape, data pointer, bytes) per tensor as tern_tensors, the
// pointers into buffers the caller (tern/_core.py) keeps alive for the call:
// read in place, nothing copied here; or, without data, (name, dtype, shape)
// (a layout). Owns the strings the views point at.
struct TensorViews {
  std::vector<std::string> names, dtypes;
  std::vector<std::vector<uint64_t>> shapes;
  std::vector<tern_tensor> views;

  TensorViews(const py::list& tensors, const char* who, bool with_data = true) {
    const size_t n = tensors.size();
    names.resize(n);
    dtypes.resize(n);
    shapes.resize(n);
    views.resize(n);
    for (size_t i = 0; i < n; ++i) {
      auto t = tensors[i].cast<py::tuple>();
      if (t.size() != (with_data ? 5u : 3u))
        throw py::value_error(std::string(who) + (with_data ? ": want (name, dtype, shape, data, bytes)"
                                                            : ": a layout entry is (name, dtype, shape)"));
      names[i] = t[0].cast<std::string>();
      dtypes[i] = t[1].cast<std::string>();
      shapes[i] = t[2].cast<std::vector<uint64_t>>();
      tern_tensor_init(&views[i]);
      views[i].name = names[i].c_str();
      views[i].dtype = dtypes[i].c_str();
      views[i].shape = shapes[i].empty() ? nullptr : shapes[i].data();
      views[i].ndim = static_cast<uint32_t>(shapes[i].size());
      if (!with_data) continue;
      views[i].data = reinterpret_cast<const void*>(t[3].cast<uintptr_t>());
      views[i].bytes = t[4].cast<uint64_t>();
    }
  }
};

// D(view) of tensors in this process's memory: the four lanes.
py::tuple ViewDigest(const py::list& tensors) {
  const TensorViews t(tensors, "view_digest");
  uint64_t lanes[4] = {};
  tern_code code;
  {
    py::gil_scoped_release release;
    code = tern_view_digest(t.views.data(), t.views.size(), lanes);
  }
  Check(code);
  return py::make_tuple(lanes[0], lanes[1], lanes[2], lanes[3]);
}

// An agent in this process (tern_agent).
class Agent {
 public:
  explicit Agent(const py::dict& kw) {
    tern_agent_options o;
    tern_agent_options_init(&o);
    OptionStrings strings;
    FillOptions(kw, &o, &strings);
    tern_code code;
    {
      py::gil_scoped_release release;  // a standby root waits here until it leads
      code = tern_agent_start(&o, &agent_);
    }
    Check(code);
  }
  ~Agent() {
    if (agent_ == nullptr) return;
    py::gil_scoped_release release;
    tern_agent_free(agent_);
  }
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  void Publish(const std::string& checkpoint, uint64_t version) {
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_agent_publish(Handle(), checkpoint.c_str(), version);
    }
    Check(code);
  }
  // tensors: (name, dtype, shape, data pointer, bytes) per tensor (see
  // TensorViews).
  void PublishTensors(uint64_t version, const py::list& tensors) {
    const TensorViews t(tensors, "publish_tensors");
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_agent_publish_tensors(Handle(), version, t.views.data(), t.views.size());
    }
    Check(code);
  }
  void DrainMember(const std::string& id) {
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_agent_drain_member(Handle(), id.c_str());
    }
    Check(code);
  }
  void RemoveMember(const std::string& id, uint32_t rejoin_after_ms) {
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_agent_remove_member(Handle(), id.c_str(), rejoin_after_ms);
    }
    Check(code);
  }
  void SetRetention(uint32_t keep_patches, uint32_t keyframe_every) {
    tern_code code;
    {
      py::gil_scoped_release release;  // waits for a publication in flight
      code = tern_agent_set_retention(Handle(), keep_patches, keyframe_every);
    }
    Check(code);
  }
  py::dict Status() {
    tern_status s{};
    s.struct_size = sizeof s;
    Check(tern_agent_status(Handle(), &s));
    return StatusDict(s);
  }
  std::string StatusJson() {
    tern_agent* a = Handle();
    return TextOut([a](char* b, size_t c, size_t* l) { return tern_agent_status_json(a, b, c, l); });
  }
  std::string PublicKeyPem() {
    tern_agent* a = Handle();
    return TextOut([a](char* b, size_t c, size_t* l) { return tern_agent_public_key_pem(a, b, c, l); });
  }
  std::string ListenAddress() {
    tern_agent* a = Handle();
    return TextOut([a](char* b, size_t c, size_t* l) { return tern_agent_listen_address(a, b, c, l); });
  }
  std::string AdminAddress() {
    tern_agent* a = Handle();
    return TextOut([a](char* b, size_t c, size_t* l) { return tern_agent_admin_address(a, b, c, l); });
  }
  py::list WaitEvents(uint64_t after_seq, uint32_t max_events, uint32_t timeout_ms) {
    tern_events* batch = nullptr;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_agent_wait_events(Handle(), after_seq, max_events, timeout_ms, &batch);
    }
    return EventList(code, batch);
  }
  void Stop() {
    if (agent_ == nullptr) return;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_agent_stop(agent_);
    }
    Check(code);
  }
  // Stops and frees now (what __exit__ and close() do); later calls raise.
  void Close() {
    if (agent_ == nullptr) return;
    tern_agent* a = std::exchange(agent_, nullptr);
    py::gil_scoped_release release;
    tern_agent_free(a);
  }

 private:
  tern_agent* Handle() {
    if (agent_ == nullptr) throw py::value_error("the agent is closed");
    return agent_;
  }
  tern_agent* agent_ = nullptr;
};

// Opens a client of `address` with the Python side's credentials (None:
// not given; tern_client_open copies them) and options; raises tern.Error.
tern_client* OpenClient(const std::string& address, const py::object& token, uint32_t timeout_ms,
                        const py::object& ca_pem, const py::object& cert_pem,
                        const py::object& key_pem, bool force = false, bool supersede = false) {
  tern_client_options o;
  tern_client_options_init(&o);
  std::string owned[4];
  auto text = [&](const py::object& v, std::string& own, const char** field) {
    if (v.is_none()) return;
    own = v.cast<std::string>();
    *field = own.c_str();
  };
  text(token, owned[0], &o.token);
  text(ca_pem, owned[1], &o.ca_pem);
  text(cert_pem, owned[2], &o.cert_pem);
  text(key_pem, owned[3], &o.key_pem);
  if (timeout_ms != 0) o.timeout_ms = timeout_ms;
  o.force = force ? 1 : 0;
  o.supersede = supersede ? 1 : 0;
  tern_client* client = nullptr;
  Check(tern_client_open(address.c_str(), &o, &client));
  return client;
}

// A client of a running agent's admin port (tern_client).
class Client {
 public:
  Client(const std::string& address, const py::object& token, uint32_t timeout_ms, bool force,
         const py::object& ca_pem, const py::object& cert_pem, const py::object& key_pem,
         bool supersede) {
    client_ = OpenClient(address, token, timeout_ms, ca_pem, cert_pem, key_pem, force, supersede);
  }
  ~Client() { tern_client_free(client_); }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void Publish(const std::string& checkpoint, uint64_t version) {
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_client_publish(client_, checkpoint.c_str(), version);
    }
    Check(code);
  }
  void DrainMember(const std::string& id) {
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_client_drain_member(client_, id.c_str());
    }
    Check(code);
  }
  void RemoveMember(const std::string& id, uint32_t rejoin_after_ms) {
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_client_remove_member(client_, id.c_str(), rejoin_after_ms);
    }
    Check(code);
  }
  void SetRetention(uint32_t keep_patches, uint32_t keyframe_every) {
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_client_set_retention(client_, keep_patches, keyframe_every);
    }
    Check(code);
  }
  py::dict Status() {
    tern_status s{};
    s.struct_size = sizeof s;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_client_status(client_, &s);
    }
    Check(code);
    return StatusDict(s);
  }
  std::string StatusJson() {
    tern_client* c = client_;
    return TextOut([c](char* b, size_t n, size_t* l) { return tern_client_status_json(c, b, n, l); });
  }
  std::string Metrics() {
    tern_client* c = client_;
    return TextOut([c](char* b, size_t n, size_t* l) { return tern_client_metrics(c, b, n, l); });
  }
  std::string PublishJobsJson() {
    tern_client* c = client_;
    return TextOut(
        [c](char* b, size_t n, size_t* l) { return tern_client_publish_jobs_json(c, b, n, l); });
  }
  std::string EventsJson(uint64_t after_seq, uint32_t max_events, uint32_t timeout_ms) {
    tern_client* c = client_;
    return TextOut([=](char* b, size_t n, size_t* l) {
      return tern_client_events_json(c, after_seq, max_events, timeout_ms, b, n, l);
    });
  }
  // (events, run): the run of the agent process that answered.
  py::tuple WaitEvents(uint64_t after_seq, uint32_t max_events, uint32_t timeout_ms) {
    tern_events* batch = nullptr;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_client_wait_events(client_, after_seq, max_events, timeout_ms, &batch);
    }
    std::string run;
    py::list events = EventList(code, batch, &run);
    return py::make_tuple(events, run);
  }

 private:
  tern_client* client_ = nullptr;
};

// A trainer rank publishing its shards to a root's admin port
// (tern_rank_publisher over a tern_client).
class RankPublisher {
 public:
  // layout: (name, dtype, shape) per tensor of the view; shards: (name,
  // first_element, element_count) per owned range.
  RankPublisher(uint32_t rank, uint32_t world_size, const py::list& layout, const py::list& shards,
                uint64_t segment_elements, uint32_t gather_timeout_ms, const std::string& address,
                const py::object& token, uint32_t timeout_ms, const py::object& ca_pem,
                const py::object& cert_pem, const py::object& key_pem) {
    client_ = OpenClient(address, token, timeout_ms, ca_pem, cert_pem, key_pem);
    const TensorViews tensors_in(layout, "Publisher", /*with_data=*/false);
    const std::vector<tern_tensor>& tensors = tensors_in.views;
    std::vector<std::string> shard_names;
    std::vector<tern_shard> owned;
    ReadShards(shards, false, &shard_names, &owned);
    tern_rank_publisher_options o;
    tern_rank_publisher_options_init(&o);
    o.rank = rank;
    o.world_size = world_size;
    o.layout = tensors.empty() ? nullptr : tensors.data();
    o.layout_count = tensors.size();
    o.shards = owned.empty() ? nullptr : owned.data();
    o.shard_count = owned.size();
    if (segment_elements != 0) o.segment_elements = segment_elements;
    if (gather_timeout_ms != 0) o.gather_timeout_ms = gather_timeout_ms;
    Check(tern_rank_publisher_create(&o, &publisher_));
  }
  ~RankPublisher() {
    tern_rank_publisher_free(publisher_);
    tern_client_free(client_);
  }
  RankPublisher(const RankPublisher&) = delete;
  RankPublisher& operator=(const RankPublisher&) = delete;

  // shards: (name, first_element, element_count, data pointer, bytes), the
  // pointers into buffers tern/_core.py keeps alive for the call. Returns
  // the part's size on the wire.
  uint64_t Publish(uint64_t version, const py::list& shards) {
    return WithShards(shards, [&](const tern_shard* given, size_t count, uint64_t* part_bytes) {
      tern_code code = tern_rank_publisher_encode(publisher_, version, given, count, part_bytes);
      return code == TERN_OK ? tern_rank_publisher_send(publisher_, client_) : code;
    });
  }
  // A restarted rank's part of `version` (tern_rank_publisher_resume):
  // `base` its shards as of base_version (empty with base_version 0: the
  // zero view), `shards` their bytes now; both as for Publish.
  uint64_t Resume(uint64_t base_version, const py::list& base, uint64_t version,
                  const py::list& shards) {
    std::vector<std::string> base_names, names;
    std::vector<tern_shard> before, given;
    ReadShards(base, true, &base_names, &before);
    ReadShards(shards, true, &names, &given);
    uint64_t part_bytes = 0;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_rank_publisher_resume(publisher_, client_, base_version,
                                        before.empty() ? nullptr : before.data(), before.size(),
                                        version, given.empty() ? nullptr : given.data(),
                                        given.size(), &part_bytes);
    }
    Check(code);
    return part_bytes;
  }
  // The rank's shards of the root's HEAD, fetched from the root
  // (tern_rank_publisher_rebase); returns that version.
  uint64_t Rebase() {
    uint64_t base_version = 0;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = tern_rank_publisher_rebase(publisher_, client_, &base_version);
    }
    Check(code);
    return base_version;
  }
  // A restarted rank's part of `version`, its base fetched from the root
  // (tern_rank_publisher_resume_from_root).
  uint64_t ResumeFromRoot(uint64_t version, const py::list& shards) {
    return WithShards(shards, [&](const tern_shard* given, size_t count, uint64_t* part_bytes) {
      return tern_rank_publisher_resume_from_root(publisher_, client_, version, given, count,
                                                  part_bytes);
    });
  }
  uint64_t Version() { return tern_rank_publisher_version(publisher_); }

 private:
  // Reads `shards` (as for Publish), runs call(shards, count, &part_bytes)
  // with the GIL released, raises its error, and returns the part's size.
  template <class Call>
  static uint64_t WithShards(const py::list& shards, Call call) {
    std::vector<std::string> names;
    std::vector<tern_shard> given;
    ReadShards(shards, true, &names, &given);
    uint64_t part_bytes = 0;
    tern_code code;
    {
      py::gil_scoped_release release;
      code = call(given.empty() ? nullptr : given.data(), given.size(), &part_bytes);
    }
    Check(code);
    return part_bytes;
  }
  static void ReadShards(const py::list& list, bool data, std::vector<std::string>* names,
                         std::vector<tern_shard>* out) {
    const size_t n = list.size();
    names->resize(n);
    out->resize(n);
    for (size_t i = 0; i < n; ++i) {
      auto t = list[i].cast<py::tuple>();
      if (t.size() != (data ? 5u : 3u))
        throw py::value_error("Publisher: a shard is (name, first_element, element_count" +
                              std::string(data ? ", data, bytes)" : ")"));
      (*names)[i] = t[0].cast<std::string>();
      tern_shard_init(&(*out)[i]);
      (*out)[i].tensor = (*names)[i].c_str();
      (*out)[i].first_element = t[1].cast<uint64_t>();
      (*out)[i].element_count = t[2].cast<uint64_t>();
      if (data) {
        (*out)[i].data = reinterpret_cast<const void*>(t[3].cast<uintptr_t>());
        (*out)[i].bytes = t[4].cast<uint64_t>();
      }
    }
  }
  tern_client* client_ = nullptr;
  tern_rank_publisher* publisher_ = nullptr;
};

}  // namespace

PYBIND11_MODULE(_tern, m) {
  m.doc() = "tern's native half: libtern's C API (include/tern/tern.h). Use the `tern` package.";
  m.def("version", &tern_version, "tern's release, e.g. '0.1.0'.");
  m.def("abi_version", &tern_abi_version, "The loaded libtern's ABI: (major << 16) | minor.");
  m.attr("ABI_VERSION") = static_cast<uint32_t>(TERN_ABI_VERSION);
  m.def("view_digest", &ViewDigest, py::arg("tensors"),
        "D(view) of (name, dtype, shape, address, bytes) tensors: four lanes.");
  m.def("code_name", [](int code) { return std::string(tern_code_name(code)); });

  py::class_<Agent>(m, "Agent")
      .def(py::init<const py::dict&>())
      .def("publish", &Agent::Publish, py::arg("checkpoint"), py::arg("version"))
      .def("status", &Agent::Status)
      .def("status_json", &Agent::StatusJson)
      .def("public_key_pem", &Agent::PublicKeyPem)
      .def("listen_address", &Agent::ListenAddress)
      .def("admin_address", &Agent::AdminAddress)
      .def("wait_events", &Agent::WaitEvents, py::arg("after_seq"), py::arg("max_events"),
           py::arg("timeout_ms"))
      .def("publish_tensors", &Agent::PublishTensors, py::arg("version"), py::arg("tensors"))
      .def("drain_member", &Agent::DrainMember, py::arg("id"))
      .def("remove_member", &Agent::RemoveMember, py::arg("id"), py::arg("rejoin_after_ms"))
      .def("set_retention", &Agent::SetRetention, py::arg("keep_patches"), py::arg("keyframe_every"))
      .def("stop", &Agent::Stop)
      .def("close", &Agent::Close);

  py::class_<RankPublisher>(m, "RankPublisher")
      .def(py::init<uint32_t, uint32_t, const py::list&, const py::list&, uint64_t, uint32_t,
                    const std::string&, const py::object&, uint32_t, const py::object&,
                    const py::object&, const py::object&>(),
           py::arg("rank"), py::arg("world_size"), py::arg("layout"), py::arg("shards"),
           py::arg("segment_elements"), py::arg("gather_timeout_ms"), py::arg("address"),
           py::arg("token"), py::arg("timeout_ms"), py::arg("ca_pem"), py::arg("cert_pem"),
           py::arg("key_pem"))
      .def("publish", &RankPublisher::Publish, py::arg("version"), py::arg("shards"))
      .def("resume", &RankPublisher::Resume, py::arg("base_version"), py::arg("base"),
           py::arg("version"), py::arg("shards"))
      .def("rebase", &RankPublisher::Rebase)
      .def("resume_from_root", &RankPublisher::ResumeFromRoot, py::arg("version"),
           py::arg("shards"))
      .def("version", &RankPublisher::Version);

  py::class_<Client>(m, "Client")
      .def(py::init<const std::string&, const py::object&, uint32_t, bool, const py::object&,
                    const py::object&, const py::object&, bool>(),
           py::arg("address"), py::arg("token"), py::arg("timeout_ms"), py::arg("force"),
           py::arg("ca_pem"), py::arg("cert_pem"), py::arg("key_pem"), py::arg("supersede") = false)
      .def("publish", &Client::Publish, py::arg("checkpoint"), py::arg("version"))
      .def("drain_member", &Client::DrainMember, py::arg("id"))
      .def("remove_member", &Client::RemoveMember, py::arg("id"), py::arg("rejoin_after_ms"))
      .def("set_retention", &Client::SetRetention, py::arg("keep_patches"),
           py::arg("keyframe_every"))
      .def("status", &Client::Status)
      .def("status_json", &Client::StatusJson)
      .def("metrics", &Client::Metrics)
      .def("publish_jobs_json", &Client::PublishJobsJson)
      .def("events_json", &Client::EventsJson, py::arg("after_seq"), py::arg("max_events"),
           py::arg("timeout_ms"))
      .def("wait_events", &Client::WaitEvents, py::arg("after_seq"), py::arg("max_events"),
           py::arg("timeout_ms"));
}
