// The sidecar's forwarding: requests to the engine, whole and streamed
// replies back, stamped (sidecar.h has the contract).
#include <condition_variable>
#include <deque>

#include "agent/sidecar/sidecar_impl.h"

namespace tern::agent {
namespace {

std::string EncodeQuery(const httplib::Params& params) {
  std::string out;
  auto encode = [&](const std::string& s) {
    static const char* hex = "0123456789ABCDEF";
    for (unsigned char c : s) {
      if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
        out += static_cast<char>(c);
      } else {
        out += '%';
        out += hex[c >> 4];
        out += hex[c & 15];
      }
    }
  };
  for (const auto& [k, v] : params) {
    out += out.empty() ? '?' : '&';
    encode(k);
    out += '=';
    encode(v);
  }
  return out;
}

bool HopByHop(std::string_view name) {
  static const std::set<std::string, std::less<>> kDrop = {
      "connection",     "keep-alive",  "transfer-encoding", "te",
      "trailer",        "upgrade",     "proxy-connection",  "proxy-authorization",
      "content-length", "host",        "accept-encoding",   "content-encoding",
      "remote_addr",    "remote_port", "local_addr",        "local_port"};
  std::string lower(name);
  for (auto& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return kDrop.count(lower) > 0 || lower.starts_with("x-tern-");
}

HeaderList ForwardHeaders(const httplib::Headers& in) {
  HeaderList out;
  for (const auto& [k, v] : in)
    if (!HopByHop(k)) out.emplace_back(k, v);
  return out;
}

void CopyReplyHeaders(const EngineHead& head, httplib::Response& res) {
  for (const auto& [k, v] : head.headers)
    if (!HopByHop(k) && k != "Content-Type" && k != "content-type") res.set_header(k, v);
}

// The per-version prefix-cache key: a version's cached prefixes never serve
// another version's request.
void SaltForVersion(Json& body, bool generate_route, uint64_t version) {
  const char* key = generate_route ? "extra_key" : "cache_salt";
  std::string salt = "tern-v" + std::to_string(version);
  auto it = body.find(key);
  if (it != body.end() && it->is_string()) salt += ";" + it->get<std::string>();
  body[key] = salt;
}

// One streamed reply between the engine thread (producer) and the server's
// content provider (consumer), bounded by buffer_bytes.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  uint64_t buffered_bytes = 0;
  bool head_ready = false, done = false, cancelled = false;
  EngineHead head;
  Status result;
  CallCanceller canceller;
  std::thread engine_thread;
  std::optional<VersionGate::Ticket> ticket;

  void Cancel() {
    {
      std::lock_guard<std::mutex> lock(mu);
      cancelled = true;
    }
    cv.notify_all();
    canceller.Cancel();
  }
  void Join() {
    if (engine_thread.joinable()) engine_thread.join();
  }
};

}  // namespace

// Unversioned: forwarded as is, the whole reply passed back.
void Sidecar::Impl::Forward(const httplib::Request& req, httplib::Response& res,
                            const std::string& path) {
  EngineHead head;
  std::string body;
  bool too_big = false;
  Status s = engine->Call(
      req.method, path + EncodeQuery(req.params), ForwardHeaders(req.headers), req.body,
      [&](const EngineHead& h) {
        head = h;
        return true;
      },
      [&](std::string_view piece) {
        if (body.size() + piece.size() > options.max_response_bytes) return !(too_big = true);
        body.append(piece);
        return true;
      });
  if (too_big)
    return Error(res, 502, "engine_reply_too_large", "EngineReplyTooLarge",
                 "the engine's reply is over the sidecar's max_response_bytes");
  if (!s.ok()) return EngineUnavailable(res, s);
  CopyReplyHeaders(head, res);
  res.status = head.status;
  res.set_content(std::move(body), head.content_type.empty() ? "text/plain" : head.content_type);
}

void Sidecar::Impl::Versioned(const httplib::Request& req, httplib::Response& res,
                              const std::string& path) {
  Json body = Json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object())
    return Error(res, 400, "bad_request", "BadRequest",
                 body.is_discarded() ? "the request body is not valid JSON"
                                     : "the request body must be a JSON object");
  auto lane = TakeConstraint(body);
  if (lane.ok())
    lane = WithHeaders(*lane, req.get_header_value("X-Tern-Min-Version"),
                       req.get_header_value("X-Tern-Max-Staleness"), gate.head());
  if (!lane.ok()) return Error(res, 400, "bad_request", "BadRequest", lane.status().message());
  // A request bounding its staleness wants a version the member can show is
  // fresh; a cut-off member's own HEAD may be old, so the header alone
  // cannot tell (docs/security.md "Freshness").
  if (options.refuse_when_stale || req.has_header("X-Tern-Max-Staleness")) {
    const ReplicaState s = State();
    if (s.member_stale) {
      Error(res, 503, "stale", "MemberStale",
            "the local member cannot show that its weights are fresh (" + s.stale_reason +
                "); retry later or elsewhere",
            /*retryable=*/true);
      res.set_header("Retry-After", "1");
      return;
    }
  }

  // A supersede withdrew the number this member serves (its served epoch is
  // below HEAD's, or its signed HEAD beacon is of a later board epoch,
  // docs/agent/board.md §4a): that number, however large, must not satisfy
  // a version constraint until the member re-bases.
  auto withdrawn = [&] {
    if (!lane->Target()) return false;
    const ReplicaState s = State();
    return s.superseded || (s.member_stale && s.stale_reason == "superseded");
  };
  if (withdrawn()) {
    Refused("superseded");
    res.set_header("Retry-After", "1");
    return Reply(res, 409, NotReadyBody(*lane, gate.applied()));
  }

  VersionGate::Admission admission = gate.Admit(*lane, options.catchup_wait_ms);
  // Again once admitted: Admit may have waited out the commit of a number
  // a supersede withdrew, whose flag the follower raised before that
  // commit began (VersionFollower::superseded).
  if (admission.ticket && withdrawn()) {
    admission.ticket.reset();
    Refused("superseded");
    res.set_header("Retry-After", "1");
    return Reply(res, 409, NotReadyBody(*lane, gate.applied()));
  }
  if (admission.waited)
    Count("tern_sidecar_catchup_waits_total",
          "Requests that waited for their version to be applied.", {});
  if (!admission.ticket) {
    Refused("not_ready");
    res.set_header("Retry-After", "1");
    return Reply(res, 409, NotReadyBody(*lane, admission.applied));
  }
  const uint64_t start = admission.ticket->start_version();
  CountServed(path, start);
  if (options.cache_salt) SaltForVersion(body, path == "/generate", start);
  // Not body.value("stream", false): it throws on a non-boolean.
  auto stream_field = body.find("stream");
  const bool stream = stream_field != body.end() && *stream_field == true;
  std::string forwarded = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  HeaderList headers = ForwardHeaders(req.headers);
  headers.emplace_back("Content-Type", kJson);
  res.set_header("X-Tern-Version", std::to_string(start));
  if (stream)
    return Streamed(res, path, std::move(headers), std::move(forwarded),
                    std::move(*admission.ticket));
  WholeReply(res, path, std::move(headers), std::move(forwarded), std::move(admission.ticket));
}

void Sidecar::Impl::WholeReply(httplib::Response& res, const std::string& path, HeaderList headers,
                               std::string body, std::optional<VersionGate::Ticket> ticket) {
  EngineHead head;
  std::string reply;
  bool too_big = false;
  Status s = engine->Call(
      "POST", path, headers, std::move(body),
      [&](const EngineHead& h) {
        head = h;
        return true;
      },
      [&](std::string_view piece) {
        if (reply.size() + piece.size() > options.max_response_bytes) return !(too_big = true);
        reply.append(piece);
        return true;
      });
  const uint64_t start = ticket->start_version();
  // The end version is read while the request still holds its ticket: in
  // place, a commit may have moved it; quiesced, it cannot have.
  const uint64_t end = gate.SettledVersion().value_or(start);
  ticket.reset();
  if (too_big)
    return Error(res, 502, "engine_reply_too_large", "EngineReplyTooLarge",
                 "the engine's reply is over the sidecar's max_response_bytes");
  if (!s.ok()) return EngineUnavailable(res, s);
  SendWhole(res, head, std::move(reply), start, end);
}

// A whole reply to the client: a 2xx JSON object stamped, anything else
// (the engine's errors) as it came.
void Sidecar::Impl::SendWhole(httplib::Response& res, const EngineHead& head, std::string reply,
                              uint64_t start, uint64_t end) {
  CopyReplyHeaders(head, res);
  res.status = head.status;
  res.set_header("X-Tern-Version-End", std::to_string(end));
  if (head.status / 100 == 2 && head.content_type.find("json") != std::string::npos) {
    Json j = Json::parse(reply, nullptr, /*allow_exceptions=*/false);
    if (!j.is_discarded() && j.is_object()) {
      StampResponse(j, start, end);
      return res.set_content(j.dump(-1, ' ', false, Json::error_handler_t::replace), kJson);
    }
  }
  res.set_content(std::move(reply), head.content_type.empty() ? "text/plain" : head.content_type);
}

void Sidecar::Impl::Streamed(httplib::Response& res, const std::string& path, HeaderList headers,
                             std::string body, VersionGate::Ticket ticket) {
  auto st = std::make_shared<Stream>();
  st->ticket.emplace(std::move(ticket));
  const uint64_t limit = options.stream_buffer_bytes;
  st->engine_thread = std::thread(
      [this, st, path, headers = std::move(headers), body = std::move(body), limit]() mutable {
        Status s = engine->Call(
            "POST", path, headers, std::move(body),
            [&](const EngineHead& h) {
              std::lock_guard<std::mutex> lock(st->mu);
              st->head = h;
              st->head_ready = true;
              st->cv.notify_all();
              return !st->cancelled;
            },
            [&](std::string_view piece) {
              std::unique_lock<std::mutex> lock(st->mu);
              st->cv.wait(lock, [&] { return st->cancelled || st->buffered_bytes < limit; });
              if (st->cancelled) return false;
              st->pieces.emplace_back(piece);
              st->buffered_bytes += piece.size();
              st->cv.notify_all();
              return true;
            },
            &st->canceller);
        std::lock_guard<std::mutex> lock(st->mu);
        st->result = std::move(s);
        st->done = true;
        st->cv.notify_all();
      });

  std::unique_lock<std::mutex> lock(st->mu);
  st->cv.wait(lock, [&] { return st->head_ready || st->done; });
  const bool is_stream = st->head_ready && st->head.status == 200 &&
                         st->head.content_type.find("text/event-stream") != std::string::npos;
  if (!is_stream) {
    // An error reply (or an engine that did not stream): passed back whole.
    st->cv.wait(lock, [&] {
      return st->done || st->buffered_bytes >= std::min(limit, options.max_response_bytes);
    });
    const bool overflow = !st->done;
    lock.unlock();
    if (overflow) st->Cancel();
    st->Join();
    const uint64_t start = st->ticket->start_version();
    const uint64_t end = gate.SettledVersion().value_or(start);
    st->ticket.reset();
    if (overflow)
      return Error(res, 502, "engine_reply_too_large", "EngineReplyTooLarge",
                   "the engine's unstreamed reply is over the sidecar's stream buffer");
    if (!st->head_ready) return EngineUnavailable(res, st->result);
    std::string reply;
    for (auto& p : st->pieces) reply += p;
    return SendWhole(res, st->head, std::move(reply), start, end);
  }
  CopyReplyHeaders(st->head, res);
  lock.unlock();
  res.status = 200;
  auto stamper = std::make_shared<EventStamper>(st->ticket->start_version(), path == "/generate");
  res.set_chunked_content_provider(
      st->head.content_type,
      [this, st, stamper](size_t, httplib::DataSink& sink) {
        std::deque<std::string> pieces;
        bool done;
        Status result;
        {
          std::unique_lock<std::mutex> lock(st->mu);
          st->cv.wait(lock, [&] { return !st->pieces.empty() || st->done; });
          pieces.swap(st->pieces);
          st->buffered_bytes = 0;
          done = st->done;
          if (done) result = st->result;
          st->cv.notify_all();
        }
        std::string out;
        const uint64_t end = gate.SettledVersion().value_or(st->ticket->start_version());
        for (const auto& p : pieces) stamper->Feed(p, end, out);
        if (done) stamper->Flush(out);
        if (done && !result.ok()) {
          Refused("engine_unavailable");
          out += "data: " +
                 ErrorBody("EngineUnavailable", "the local inference engine stopped mid-stream",
                           true) +
                 "\n\n";
        }
        if (!out.empty() && !sink.write(out.data(), out.size())) {
          Count("tern_sidecar_client_aborts_total",
                "Streams whose client went away (the engine request was closed).", {});
          st->Cancel();
          return false;
        }
        if (done) sink.done();
        return true;
      },
      [st](bool) {
        st->Cancel();
        st->Join();
        st->ticket.reset();
      });
}

}  // namespace tern::agent
