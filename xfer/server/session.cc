// A file-server session: the inbox and the request handling (session.h).
#include "xfer/server/session.h"

#include <chrono>
#include <utility>

#include "base/log.h"
#include "base/text.h"

namespace tern::xfer {

ConnectionHandlers Session::Handlers() {
  ConnectionHandlers h;
  std::weak_ptr<Session> weak = weak_from_this();
  h.on_message = [weak](std::string m) {
    auto s = weak.lock();
    if (!s) return;
    std::lock_guard<std::mutex> lock(s->mu_);
    if (s->closed_) return;
    if (m.size() > kMaxRequestBytes) {
      s->refused_ = "a message of " + std::to_string(m.size()) + " bytes (at most " +
                    std::to_string(kMaxRequestBytes) + " allowed), closing";
      s->closed_ = true;
    } else if (s->inbox_.size() >= kMaxInbox || s->inbox_bytes_ + m.size() > kMaxInboxBytes) {
      s->refused_ = "more than " + std::to_string(kMaxInbox) + " requests or " +
                    std::to_string(kMaxInboxBytes) + " bytes queued, closing";
      s->closed_ = true;
    } else {
      s->inbox_bytes_ += m.size();
      s->inbox_.push_back(std::move(m));
    }
    s->cv_.notify_all();
  };
  h.on_closed = [weak](Status) {
    if (auto s = weak.lock()) s->Close();
  };
  return h;
}

void Session::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  cv_.notify_all();
}

bool Session::Closed() {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

bool Session::Next(std::string* msg) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !inbox_.empty(); });
  if (!refused_.empty()) LogLine(cx_.options.log, "xfer: " + conn_->peer_address() + ": " + refused_);
  if (closed_) return false;
  *msg = std::move(inbox_.front());
  inbox_.pop_front();
  inbox_bytes_ -= msg->size();
  return true;
}

void Session::Release() {
  if (f_.head) f_.head->Wait().IgnoreError();  // it reads f_'s region
  if (f_.region.handle != 0) cx_.transport.DeregisterMemory(f_.region).IgnoreError();
  f_ = Served{};
}

void Session::Run() {
  std::string msg;
  while (Next(&msg)) {
    const char type = TypeOf(msg);
    if (type == kGet) {
      OnGet(msg);
    } else if (type == kWant) {
      OnWant(msg);
    } else {
      LogLine(cx_.options.log, "xfer: " + conn_->peer_address() + ": unknown request type '" +
                                   Printable(std::string_view(msg).substr(0, 1)) + "', closing");
      break;
    }
  }
  Release();
  conn_->Close();
}

void Session::OnGet(const std::string& msg) {
  Release();
  std::string have;
  auto info = Open(msg, &have);
  if (!info.ok()) {
    Release();  // a half-opened file must not serve a later WANT
    LogLine(cx_.options.log, "xfer: " + conn_->peer_address() + ": " + info.status().ToString());
    conn_->SendMessage(EncodeStatus(kError, info.status()), nullptr);
    return;
  }
  conn_->SendMessage(EncodeInfo(*info), nullptr);
  if (info->sending() || (info->head() && f_.head_chunks == f_.Chunks())) {
    conn_->SendMessage(EncodeStatus(kDone, Transfer(have)), nullptr);
    return;
  }
  if (info->head()) {
    f_.head = HeadSend::Start(cx_.threads, conn_, f_.region, f_.window_id, f_.file->size, f_.chunk_bytes,
                              f_.head_chunks, cx_.options.send, cx_.clock);
  }
  f_.awaiting_want = true;
}

void Session::OnWant(const std::string& msg) {
  Status st = TERN_ERROR(kProtocol, "WANT without a GET waiting for one");
  if (f_.awaiting_want) {
    f_.awaiting_want = false;
    const uint64_t chunks = f_.Chunks();  // bounded by Open (ChunkCount)
    auto want = DecodeWant(msg, (chunks + 7) / 8);
    if (want.ok()) st = CheckBitmap(want->bitmap, chunks);
    if (!want.ok()) {
      st = want.status();
    } else if (st.ok()) {
      f_.window_id = want->transfer_id;
      // The head's chunks are on their way already.
      for (uint64_t i = 0; i < f_.head_chunks; ++i) want->bitmap[i >> 3] |= static_cast<char>(1u << (i & 7));
      st = Transfer(want->bitmap);
      if (f_.head) {
        Status head = f_.head->Wait();
        f_.head.reset();
        if (st.ok()) st = head;
      }
    }
  }
  conn_->SendMessage(EncodeStatus(kDone, st), nullptr);
}

// Opens the file a GET names and makes its INFO; *have is the client's
// bitmap when the server sends without waiting for WANT.
Result<Info> Session::Open(std::string_view msg, std::string* have) {
  TERN_ASSIGN_OR_RETURN(GetRequest get, DecodeGet(msg));
  // Before the name is even resolved: without the token a client learns
  // nothing, not even which objects exist.
  TERN_REQUIRE(cx_.options.access_token.empty() ||
                   SecretEquals(cx_.options.access_token, get.access_token),
               kAuth, "GET without this server's access token");
  TERN_ASSIGN_OR_RETURN(std::string path, cx_.sandbox.Resolve(get.name));
  TERN_ASSIGN_OR_RETURN(f_.file, MapServedFile(path));
  const uint64_t size = f_.file->size;
  TERN_RETURN_IF_ERROR(ChunkCount(size, get.chunk_bytes).status());
  f_.chunk_bytes = get.chunk_bytes;
  f_.transfer_id = f_.window_id = get.transfer_id;
  if (size > 0) {
    TERN_ASSIGN_OR_RETURN(f_.region, cx_.transport.RegisterMemory(f_.file->base, size, MemoryKind::kHost));
  }
  Info info{size, f_.file->id.Tag(), get.transfer_id, 0, 0};
  if (size <= kInlineHashBytes) {
    // Cheaper than a HASH message; a racy or changed file is hashed again
    // after its data went out (FinishHash).
    HashCache& hashes = cx_.hashes;
    const HashOutcome h =
        HashFd(f_.file->fd, f_.file->id, [&hashes] { return hashes.stopped(); }, hashes.settle_ns());
    if (h.end == HashOutcome::kOk && h.cacheable) {
      f_.hash_known = true;
      f_.xxh3 = h.xxh3;
    }
  } else {
    f_.job = cx_.hashes.For(*f_.file, path);
    if (f_.job && f_.job->finished.load()) {
      std::lock_guard<std::mutex> lock(f_.job->mu);
      if (f_.job->ok && f_.job->cacheable) {
        f_.hash_known = true;
        f_.xxh3 = f_.job->xxh3;
      }
    }
    if (f_.hash_known) f_.job.reset();
  }
  if (f_.hash_known) {
    info.flags |= kInfoHashKnown;
    info.xxh3 = f_.xxh3;
  }
  // The bitmap was checked against (have_size, chunk_bytes) by DecodeGet.
  if (get.have_tag == info.tag && get.have_size == size) {
    info.flags |= kInfoSending;
    *have = std::move(get.have_bitmap);
  } else if (get.head_bytes > 0 && size > 0) {
    // The chunks wholly inside the head window: all when the file fits.
    const uint64_t chunks = f_.Chunks();
    f_.head_chunks = size <= get.head_bytes ? chunks : get.head_bytes / get.chunk_bytes;
    info.flags |= kInfoHead;
    *have = BitmapFrom(chunks, f_.head_chunks);  // past the head counts as present
  }
  return info;
}

// Sends the chunks missing from `have` into the client's window, then makes
// sure the client has the whole-file hash (HASH goes out as soon as the
// background hasher has it, between acknowledgements).
Status Session::Transfer(std::string_view have) {
  TERN_ASSIGN_OR_RETURN(ChunkMap map, ChunkMap::Make(f_.file->size, f_.chunk_bytes));
  TERN_RETURN_IF_ERROR(map.SetBits(have));
  if (!map.complete()) {
    SendOptions so = cx_.options.send;
    so.on_progress = [this, user = cx_.options.send.on_progress](uint64_t done_bytes) {
      MaybeSendHash();
      if (user) user(done_bytes);
    };
    TERN_RETURN_IF_ERROR(SendChunks(*conn_, f_.region, 0, f_.window_id, map, so, cx_.clock));
  }
  TERN_RETURN_IF_ERROR(FinishHash());
  TERN_REQUIRE(f_.file->Unchanged(), kUnavailable, "the file changed while it was served; fetch again");
  return Status::Ok();
}

void Session::MaybeSendHash() {
  if (f_.hash_known || !f_.job || !f_.job->finished.load()) return;
  std::lock_guard<std::mutex> lock(f_.job->mu);
  if (!f_.job->ok) return;  // FinishHash reports it (or hashes itself when cancelled)
  f_.hash_known = true;
  f_.xxh3 = f_.job->xxh3;
  conn_->SendMessage(EncodeHash({f_.transfer_id, f_.xxh3}), nullptr);
}

Status Session::FinishHash() {
  if (f_.hash_known) return Status::Ok();
  if (f_.job) {
    for (;;) {  // bounded by hashing one file; ends early when the client leaves
      {
        std::unique_lock<std::mutex> lock(f_.job->mu);
        if (f_.job->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return f_.job->done; })) break;
      }
      TERN_REQUIRE(!Closed(), kCancelled, "client left before the hash was ready");
    }
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> lock(f_.job->mu);
      cancelled = f_.job->cancelled;
    }
    if (!cancelled) {
      MaybeSendHash();
      TERN_REQUIRE(f_.hash_known, kUnavailable, "the file changed while it was hashed; fetch again");
      return Status::Ok();
    }
    f_.job.reset();  // dropped before this session took it: hash here
  }
  // The hash queue was full (or the job was dropped): hash here, after the
  // data went out, in one of the bounded hashing slots; it stops when the
  // client leaves, and its digest is cached like a background one.
  HashCache& hashes = cx_.hashes;
  auto stop = [&] { return hashes.stopped() || Closed(); };
  TERN_REQUIRE(hashes.AcquireSlot(stop), kCancelled, "client left before the hash was ready");
  const HashOutcome h = HashFd(f_.file->fd, f_.file->id, stop, hashes.settle_ns());
  hashes.ReleaseSlot();
  TERN_REQUIRE(h.end != HashOutcome::kStopped, kCancelled, "client left before the hash was ready");
  TERN_REQUIRE(h.end == HashOutcome::kOk, kUnavailable, "the file changed while it was hashed; fetch again");
  if (h.cacheable) hashes.Insert(f_.file->id, h.xxh3);
  f_.hash_known = true;
  f_.xxh3 = h.xxh3;
  conn_->SendMessage(EncodeHash({f_.transfer_id, f_.xxh3}), nullptr);
  return Status::Ok();
}

}  // namespace tern::xfer
