// The board and publishing: versions published and applied bit-exactly,
// refusals, recovery (forged and damaged records refused, missing objects
// routed around), crashes at every write of a publish, the keyframe policy.
// Catch-up and retention: board_plan_test.cc.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "agent/board/model_files.h"
#include "base/text.h"
#include "tern/fault_env.h"
#include "tests/support/agent_board.h"

namespace tern::agent {
namespace {

using testing::ApplyPlan;
using testing::BytesOf;
using testing::Model;

class BoardTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(verifier.AddTrustedKey(signer.public_key()).ok()); }

  Result<std::unique_ptr<Board>> Open(Env& env, BoardOptions options = {}) {
    auto log = OpenFileBoardLog(env, "/root/board");
    if (!log.ok()) return log.status();
    return Board::Open(env, "/root/objects", std::move(*log), verifier, options,
                       [this](std::string_view line) {
                         std::lock_guard lock(mu);
                         lines.emplace_back(line);
                       });
  }
  std::unique_ptr<Board> MustOpen(Env& env, BoardOptions options = {}) {
    auto board = Open(env, options);
    EXPECT_TRUE(board.ok()) << board.status().ToString();
    TERN_ASSERT(board.ok(), "opening the board");
    return std::move(board).value();
  }
  // Publishes model.views[version] (which must exist) on top of HEAD.
  Result<PublishResult> Publish(Board& board, uint64_t version, PublishOptions options = {}) {
    const uint64_t head = board.head();
    const ServeView next = model.at(version).View();
    if (head == 0) return PublishVersion(board, signer, nullptr, {}, next, version, options, pool);
    const ServeView prev = model.at(head).View();
    auto m = board.Manifest(head);
    if (!m.ok()) return m.status();
    return PublishVersion(board, signer, &prev, m->target_digest, next, version, options, pool);
  }
  bool Logged(std::string_view what) {
    std::lock_guard lock(mu);
    for (const auto& l : lines)
      if (l.find(what) != std::string::npos) return true;
    return false;
  }

  ManifestSigner signer = testing::SignerFromByte(1);
  ManifestVerifier verifier;
  std::unique_ptr<Env> env = NewMemEnv();
  ThreadPool pool{2};
  Model model;
  std::mutex mu;
  std::vector<std::string> lines;
};

TEST_F(BoardTest, FirstVersionIsAKeyframeThenPatchesChainAndApply) {
  auto board = MustOpen(*env);
  const BoardId id = board->id();
  for (uint64_t v = 1; v <= 4; ++v) {
    model.Next(50, 1 << 20);
    auto r = Publish(*board, v);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->manifest.board_id, id);
    EXPECT_EQ(r->manifest.parent, v - 1);
    EXPECT_EQ(r->patch_bytes > 0, v > 1);
    EXPECT_EQ(r->keyframe_bytes > 0, v == 1);
    EXPECT_EQ(board->head(), v);
  }
  auto m1 = board->Manifest(1);
  ASSERT_EQ(m1->objects.size(), 1u);
  EXPECT_EQ(m1->objects[0].kind, ObjectKind::kKeyframe);
  // A new member: keyframe(1) + patches, verified against the signed manifests.
  auto plan = board->PlanCatchUp(0, 4);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->objects.size(), 4u);
  EXPECT_EQ(plan->signed_manifests.size(), 4u);
  auto applied = ApplyPlan(*env, *board, verifier, *plan, model.at(0), pool);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(*applied, BytesOf(model.at(4)));
  EXPECT_EQ(board->Manifest(4)->target_digest, ComputeDigest(model.at(4).View(), pool));
}

// PublishOptions::format_version picks the objects' format (the root's
// --patch-format); both chain and apply the same.
// A checkpoint's model files: the rule (small regular files beside the
// tensors, no index, no dot file, no directory), stored by content, signed
// in the version's manifest and in a squash of it; the bounds refused.
std::span<const uint8_t> Span(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST_F(BoardTest, ModelFilesAreGatheredSignedAndKeptByContent) {
  auto write = [&](const std::string& path, const std::string& text) {
    ASSERT_TRUE(WriteNewFile(*env, path, Span(text)).ok()) << path;
  };
  ASSERT_TRUE(CreateDirs(*env, "/ckpt/sub").ok());
  write("/ckpt/config.json", "{}");
  write("/ckpt/tokenizer.json", "tok");
  write("/ckpt/model.safetensors", "not read");
  write("/ckpt/model.safetensors.index.json", "{}");
  write("/ckpt/.hidden", "x");
  write("/ckpt/sub/inner.json", "x");
  write("/ckpt/optimizer.pt", std::string(kMaxManifestFileBytes + 1, 'o'));
  auto log = [this](std::string_view line) {
    std::lock_guard lock(mu);
    lines.emplace_back(line);
  };
  auto files = StoreModelFiles(*env, "/ckpt", "/root/objects/files", log);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  ASSERT_EQ(files->size(), 2u);
  EXPECT_EQ((*files)[0].name, "config.json");
  EXPECT_EQ((*files)[1].name, "tokenizer.json");
  EXPECT_EQ((*files)[1].bytes, 3u);
  EXPECT_EQ((*files)[1].sha256, Sha256Of(Span(std::string("tok"))));
  EXPECT_TRUE(Logged("optimizer.pt"));
  std::string stored;
  ASSERT_TRUE(ReadFileToString(*env, "/root/objects/files/" + Hex((*files)[1].sha256), 100, &stored).ok());
  EXPECT_EQ(stored, "tok");

  auto board = MustOpen(*env);
  PublishOptions options;
  options.files = *files;
  model.Next(50, 1 << 20);
  model.Next(50, 1 << 20);
  ASSERT_TRUE(Publish(*board, 1, options).ok());
  ASSERT_TRUE(Publish(*board, 2, options).ok());
  EXPECT_EQ(board->Manifest(2)->files, *files);
  // A squash's manifest names its version's files too.
  ASSERT_TRUE(MakeSquash(*board, signer, 0, 2, {}, pool).ok());
  const auto signed_manifests = board->SignedManifests(2);
  ASSERT_EQ(signed_manifests.size(), 2u);
  auto squash = verifier.Verify(signed_manifests[1]);
  ASSERT_TRUE(squash.ok());
  EXPECT_EQ(squash->files, *files);
  // Restart: the board's records with files verify again.
  board.reset();
  board = MustOpen(*env);
  EXPECT_EQ(board->Manifest(1)->files, *files);

  // Too many files: a clear refusal.
  ASSERT_TRUE(CreateDirs(*env, "/many").ok());
  for (uint32_t i = 0; i <= kMaxManifestFiles; ++i) write("/many/f" + std::to_string(100 + i), "x");
  auto many = StoreModelFiles(*env, "/many", "/root/objects/files", log);
  EXPECT_EQ(many.status().code(), Code::kInvalidArgument) << many.status().ToString();
  // Retention: files no version names go.
  ASSERT_TRUE(RetainModelFiles(*env, "/root/objects/files", {Hex((*files)[0].sha256)}).ok());
  auto left = env->ListDir("/root/objects/files", 100);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, std::vector<std::string>{Hex((*files)[0].sha256)});
}

TEST_F(BoardTest, PublishesTheFormatItIsAskedFor) {
  // (format, nibble coding): format 2 writes file version 3 where it codes
  // a packed tensor as nibbles (the model's tensors are U32 and U8), never
  // with nibble coding off, its squashes on the base included.
  for (auto [format, nibbles] : {std::pair{uint16_t{1}, true}, {uint16_t{2}, true}, {uint16_t{2}, false}}) {
    std::unique_ptr<Env> fresh = NewMemEnv();
    auto board = MustOpen(*fresh);
    PublishOptions options;
    options.format_version = format;
    options.nibble_coding = nibbles;
    auto file_version = [&](const ObjectRef& ref) -> uint16_t {
      std::string bytes;
      EXPECT_TRUE(ReadFileToString(*fresh, board->ObjectPath(ref), 1 << 30, &bytes).ok());
      auto info = Inspect({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
      EXPECT_TRUE(info.ok()) << info.status().ToString();
      return info.ok() ? info->format_version : 0;
    };
    int version3 = 0;
    for (uint64_t v = 1; v <= 3; ++v) {
      if (model.views.size() <= v) model.Next(50, 1 << 20);
      auto r = Publish(*board, v, options);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      for (const auto& o : r->manifest.objects) {
        const uint16_t written = file_version({o.kind, o.from_version, o.to_version});
        version3 += written == 3;
        if (nibbles) {
          EXPECT_EQ(written == 3 ? 2 : written, format) << "version " << v;
        } else {
          EXPECT_EQ(written, format) << "version " << v << ", nibble coding off";
        }
      }
    }
    // The sparse patches of these packed tensors are smaller as nibbles:
    // without this, "off" above would prove nothing.
    if (format == 2 && nibbles) {
      EXPECT_GT(version3, 0);
    }
    if (format == 2) {
      // A catch-up squash with nibble coding off is never version 3, also
      // of version-3 inputs (when `nibbles`: published before the switch),
      // which a squash without the base would keep.
      PublishOptions off = options;
      off.nibble_coding = false;
      auto squash = MakeSquash(*board, signer, 1, 3, off, pool);
      ASSERT_TRUE(squash.ok()) << squash.status().ToString();
      const uint16_t written = file_version({ObjectKind::kSquash, 1, 3});
      EXPECT_GE(written, 1);
      EXPECT_LE(written, 2) << "a squash with nibble coding off";
    }
    auto plan = board->PlanCatchUp(0, 3);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    auto applied = ApplyPlan(*fresh, *board, verifier, *plan, model.at(0), pool);
    ASSERT_TRUE(applied.ok()) << applied.status().ToString();
    EXPECT_EQ(*applied, BytesOf(model.at(3)));
  }
}

TEST_F(BoardTest, RefusesBadPublications) {
  auto board = MustOpen(*env);
  model.Next(10, 100);
  model.Next(10, 100);
  const ServeView v1 = model.at(1).View(), v2 = model.at(2).View();
  EXPECT_EQ(PublishVersion(*board, signer, &v1, {}, v2, 2, {}, pool).status().code(),
            Code::kInvalidArgument);  // prev for an empty board
  ASSERT_TRUE(Publish(*board, 1).ok());
  const ViewDigest d1 = board->Manifest(1)->target_digest;
  EXPECT_EQ(PublishVersion(*board, signer, &v1, d1, v2, 1, {}, pool).status().code(),
            Code::kInvalidArgument);  // not newer
  EXPECT_EQ(PublishVersion(*board, signer, nullptr, {}, v2, 2, {}, pool).status().code(),
            Code::kInvalidArgument);  // no prev
  EXPECT_EQ(PublishVersion(*board, signer, &v1, ViewDigest{}, v2, 2, {}, pool).status().code(),
            Code::kMismatch);  // prev_digest is not D(HEAD)
  EXPECT_EQ(PublishVersion(*board, signer, &v2, d1, v2, 2, {}, pool).status().code(),
            Code::kMismatch);  // prev is not the view of HEAD
  // A signer the board does not trust: nothing recorded, its files removed.
  const ManifestSigner stranger = testing::SignerFromByte(9);
  EXPECT_EQ(PublishVersion(*board, stranger, &v1, d1, v2, 2, {}, pool).status().code(), Code::kAuth);
  EXPECT_EQ(board->head(), 1u);
  EXPECT_EQ(*env->ListDir("/root/objects", 100), std::vector<std::string>{"keyframe-1-1"});
  ASSERT_TRUE(PublishVersion(*board, signer, &v1, d1, v2, 5, {}, pool).ok());  // gaps are fine
  EXPECT_EQ(board->Versions(), (std::vector<uint64_t>{1, 5}));
}

// A previous view that is not HEAD's (a bit of DIR/current flipped on disk,
// in a byte the diff finds unchanged or changed) fails the publish before
// anything is signed or written: kMismatch naming the digest, HEAD and the
// object files as they were, and the same version publishes from the right
// view afterwards. D(prev) is hashed in the diff's pass (Diff's
// old_digest); with verify_prev_digest off the damaged view publishes, so
// the check, not some other step, is what refuses it.
TEST_F(BoardTest, ADamagedPreviousViewFailsThePublish) {
  auto board = MustOpen(*env);
  model.Next(10, 100);
  model.Next(10, 100);  // changes within the first 100 bytes of each tensor
  ASSERT_TRUE(Publish(*board, 1).ok());
  const ViewDigest d1 = board->Manifest(1)->target_digest;
  const ServeView v2 = model.at(2).View();
  struct Flip {
    size_t tensor, byte;
  };
  for (const Flip flip : {Flip{1, 15000}, Flip{0, 40}, Flip{0, 4096 * 4 - 1}}) {
    SCOPED_TRACE("tensor " + std::to_string(flip.tensor) + " byte " + std::to_string(flip.byte));
    for (uint16_t format : {uint16_t{1}, uint16_t{2}}) {
      tern::testing::OwnedView damaged(model.at(1).View());
      damaged.data[flip.tensor][flip.byte] ^= 0x10;
      const ServeView prev = damaged.View();
      PublishOptions options;
      options.format_version = format;
      auto r = PublishVersion(*board, signer, &prev, d1, v2, 2, options, pool);
      ASSERT_EQ(r.status().code(), Code::kMismatch) << r.status().ToString();
      EXPECT_NE(r.status().message().find("publish: the previous view's digest is " +
                                          ComputeDigest(prev, pool).ToString() + ", not D(1)"),
                std::string::npos)
          << r.status().ToString();
      EXPECT_EQ(board->head(), 1u);
      EXPECT_EQ(board->Versions(), std::vector<uint64_t>{1});
      EXPECT_EQ(*env->ListDir("/root/objects", 100), std::vector<std::string>{"keyframe-1-1"});
    }
  }
  {
    tern::testing::OwnedView damaged(model.at(1).View());
    damaged.data[1][15000] ^= 0x10;
    const ServeView prev = damaged.View();
    std::unique_ptr<Env> other = NewMemEnv();
    auto unchecked = MustOpen(*other);
    ASSERT_TRUE(Publish(*unchecked, 1).ok());
    PublishOptions off;
    off.verify_prev_digest = false;
    EXPECT_TRUE(PublishVersion(*unchecked, signer, &prev, d1, v2, 2, off, pool).ok());
  }
  auto r = Publish(*board, 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(board->head(), 2u);
}

TEST_F(BoardTest, RestartRecoversEverything) {
  BoardId id;
  {
    auto board = MustOpen(*env);
    id = board->id();
    for (uint64_t v = 1; v <= 3; ++v) {
      model.Next(20, 1000);
      ASSERT_TRUE(Publish(*board, v).ok());
    }
  }
  auto board = Open(*env);
  ASSERT_TRUE(board.ok()) << board.status().ToString();
  EXPECT_EQ((*board)->id(), id);
  EXPECT_EQ((*board)->head(), 3u);
  EXPECT_EQ((*board)->Versions(), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_TRUE((*board)->HasObject({ObjectKind::kPatch, 2, 3}));
  model.Next(20, 1000);
  ASSERT_TRUE(Publish(**board, 4).ok());
  auto plan = (*board)->PlanCatchUp(1, 4);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto applied = ApplyPlan(*env, **board, verifier, *plan, model.at(1), pool);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(*applied, BytesOf(model.at(4)));
}

TEST_F(BoardTest, MissingObjectIsFlaggedAndRoutedAround) {
  {
    auto board = MustOpen(*env);
    for (uint64_t v = 1; v <= 3; ++v) {
      model.Next(20, 1000);
      ASSERT_TRUE(Publish(*board, v).ok());
    }
  }
  ASSERT_TRUE(env->RemoveFile("/root/objects/patch-1-2").ok());
  auto board = MustOpen(*env);
  EXPECT_TRUE(Logged("not on disk"));
  EXPECT_FALSE(board->HasObject({ObjectKind::kPatch, 1, 2}));
  auto plan = board->PlanCatchUp(1, 3);  // 1 -> 2 is gone: keyframe(1) + 1->2 neither
  EXPECT_EQ(plan.status().code(), Code::kNotFound) << plan.status().ToString();
  plan = board->PlanCatchUp(2, 3);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->objects, (std::vector<ObjectRef>{{ObjectKind::kPatch, 2, 3}}));
}

// Records the board never signed (or not like this) make Open fail.
TEST_F(BoardTest, ForgedOrInconsistentRecordsAreRefusedAtRecovery) {
  const ManifestSigner stranger = testing::SignerFromByte(7);
  struct Case {
    const char* name;
    Code code;
    std::function<std::string(const VersionManifest&)> forge;  // bytes for record 3/0
  };
  const std::vector<Case> cases = {
      {"signed by an untrusted key", Code::kAuth,
       [&](const VersionManifest& m) { return *stranger.Sign(m); }},
      {"a flipped byte", Code::kAuth,
       [&](const VersionManifest& m) {
         std::string s = *signer.Sign(m);
         s[40] ^= 1;
         return s;
       }},
      {"another board", Code::kMismatch,
       [&](VersionManifest m) {
         m.board_id[0] ^= 1;
         return *signer.Sign(m);
       }},
      {"breaks the digest chain", Code::kMismatch,
       [&](VersionManifest m) {
         m.base_digest.lanes[0] ^= 1;
         return *signer.Sign(m);
       }},
      {"another version's manifest", Code::kCorrupt,
       [&](VersionManifest m) {
         m.version = 4;
         m.objects[0].to_version = 4;
         return *signer.Sign(m);
       }},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto mem = NewMemEnv();
    VersionManifest m3;
    {
      auto board = MustOpen(*mem);
      model = Model();
      for (uint64_t v = 1; v <= 2; ++v) {
        model.Next(20, 1000);
        ASSERT_TRUE(Publish(*board, v).ok());
      }
      m3 = *board->Manifest(2);
      m3.version = 3;
      m3.parent = 2;
      m3.base_digest = m3.target_digest;
      m3.objects[0].from_version = 2;
      m3.objects.resize(1);  // the patch
      m3.objects[0].to_version = 3;
    }
    {
      auto log = OpenFileBoardLog(*mem, "/root/board").value();
      ASSERT_TRUE(log->Append({0, 3}, 0, c.forge(m3), true, {0, 2}).ok());
    }
    auto board = Open(*mem);
    ASSERT_FALSE(board.ok());
    EXPECT_EQ(board.status().code(), c.code) << board.status().ToString();
    EXPECT_NE(board.status().message().find("3/0"), std::string::npos) << board.status().ToString();
  }
}

// A log backend (etcd, say) that hands back nonsense: refused, no crash.
class CannedLog final : public BoardLog {
 public:
  explicit CannedLog(std::vector<BoardRecord> records) : records_(std::move(records)) {}
  Result<BoardId> InitId(const BoardId&) override { return BoardId{}; }
  Status Append(BoardPos, uint32_t, std::string, bool, BoardPos) override {
    return Status(Code::kUnsupported, "canned");
  }
  Result<std::vector<BoardRecord>> LoadAll() override { return records_; }
  Result<uint64_t> Head() override { return uint64_t{1}; }
  Status DropBelow(BoardPos) override { return Status::Ok(); }

 private:
  std::vector<BoardRecord> records_;
};

// A log whose appends wait at a gate: a slow etcd round trip.
class GatedLog final : public BoardLog {
 public:
  explicit GatedLog(std::unique_ptr<BoardLog> inner) : inner_(std::move(inner)) {}
  Result<BoardId> InitId(const BoardId& c) override { return inner_->InitId(c); }
  Status Append(BoardPos v, uint32_t seq, std::string bytes, bool advance,
                BoardPos expected) override {
    entered.set_value();
    if (release.wait_for(std::chrono::seconds(20)) != std::future_status::ready)
      return Status(Code::kTimeout, "gate never opened");
    return inner_->Append(v, seq, std::move(bytes), advance, expected);
  }
  Result<std::vector<BoardRecord>> LoadAll() override { return inner_->LoadAll(); }
  Result<uint64_t> Head() override { return inner_->Head(); }
  Status DropBelow(BoardPos v) override { return inner_->DropBelow(v); }

  std::promise<void> entered;
  std::shared_future<void> release;

 private:
  std::unique_ptr<BoardLog> inner_;
};

TEST_F(BoardTest, ReadersAreNotHeldUpByTheLogsIo) {
  for (int i = 0; i < 2; ++i) model.Next(20, 1000);
  {
    auto board = MustOpen(*env);
    ASSERT_TRUE(Publish(*board, 1).ok());
  }
  auto gated = std::make_unique<GatedLog>(OpenFileBoardLog(*env, "/root/board").value());
  GatedLog* gate = gated.get();
  std::promise<void> open_gate;
  gate->release = open_gate.get_future().share();
  auto entered = gate->entered.get_future();
  auto opened = Board::Open(*env, "/root/objects", std::move(gated), verifier, {},
                            [](std::string_view) {});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Board& board = **opened;
  auto publish = std::async(std::launch::async, [&] { return Publish(board, 2).status(); });
  ASSERT_EQ(entered.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  // The publish is inside the log's Append now; readers must still answer.
  auto reader = std::async(std::launch::async, [&] {
    return std::pair(board.head(), board.PlanCatchUp(0, 1).ok());
  });
  const bool answered = reader.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  open_gate.set_value();
  EXPECT_TRUE(answered);
  EXPECT_EQ(reader.get(), std::pair(uint64_t{1}, true));
  EXPECT_TRUE(publish.get().ok());
  EXPECT_EQ(board.head(), 2u);
}

// Recovering from a wrong version number (docs/agent/board.md §4a): 1, 2,
// then 9 by mistake; a supersede renumbers to 3 in epoch 1 with the
// backwards patch(9 -> 3) and keyframe(3); members at 9, at 2 and new ones
// reach 3 bit for bit; publishing goes on at 4; numbers in the log are
// refused, also after a restart; retention drops the withdrawn 9 with the
// rest of epoch 0.
TEST_F(BoardTest, SupersedeRenumbersBelowHeadAndEveryMemberFollows) {
  for (int i = 0; i < 10; ++i) model.Next(20, 1000);
  PublishOptions supersede;
  supersede.supersede = true;
  {
    auto board = MustOpen(*env);
    for (uint64_t v : {1, 2, 9}) ASSERT_TRUE(Publish(*board, v).ok()) << v;
    // Not below HEAD, a number in the log, or an ordinary publish below HEAD.
    EXPECT_EQ(Publish(*board, 10, supersede).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(Publish(*board, 2, supersede).status().code(), Code::kAlreadyExists);
    EXPECT_EQ(Publish(*board, 3).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(board->head_pos(), (BoardPos{0, 9}));

    auto r = Publish(*board, 3, supersede);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->manifest.epoch, 1u);
    EXPECT_TRUE(r->manifest.supersede);
    EXPECT_EQ(r->manifest.parent, 9u);
    EXPECT_GT(r->patch_bytes, 0u);
    EXPECT_GT(r->keyframe_bytes, 0u);
    EXPECT_TRUE(board->HasObject({ObjectKind::kPatch, 9, 3}));
    EXPECT_EQ(board->head(), 3u);
    EXPECT_EQ(board->head_pos(), (BoardPos{1, 3}));
    for (uint64_t have : {9, 2, 1, 0}) {
      SCOPED_TRACE(have);
      auto plan = board->PlanCatchUp(have, 3);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      if (have == 9) {
        EXPECT_EQ(plan->objects, (std::vector<ObjectRef>{{ObjectKind::kPatch, 9, 3}}));
      }
      auto applied = ApplyPlan(*env, *board, verifier, *plan, model.at(have), pool);
      ASSERT_TRUE(applied.ok()) << applied.status().ToString();
      EXPECT_EQ(*applied, BytesOf(model.at(3)));
    }
    // A member at 3 is not behind the withdrawn 9's numbers: 9 is before it.
    EXPECT_EQ(board->PlanCatchUp(3, 9).status().code(), Code::kInvalidArgument);

    // Epoch 1 goes on as usual; the withdrawn number stays taken.
    auto r4 = Publish(*board, 4);
    ASSERT_TRUE(r4.ok()) << r4.status().ToString();
    EXPECT_EQ(r4->manifest.epoch, 1u);
    EXPECT_FALSE(r4->manifest.supersede);
    EXPECT_EQ(Publish(*board, 9).status().code(), Code::kAlreadyExists);
    EXPECT_FALSE(board->HasObject({ObjectKind::kPatch, 4, 9}));
    EXPECT_EQ(Publish(*board, 5, supersede).status().code(), Code::kInvalidArgument);
    EXPECT_EQ(board->head_pos(), (BoardPos{1, 4}));
  }
  // A restart finds the chain by position.
  auto board = MustOpen(*env);
  EXPECT_EQ(board->head_pos(), (BoardPos{1, 4}));
  EXPECT_EQ(*board->PosOf(9), (BoardPos{0, 9}));
  for (uint64_t have : {9, 2, 0}) {
    SCOPED_TRACE(have);
    auto plan = board->PlanCatchUp(have, 4);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    auto applied = ApplyPlan(*env, *board, verifier, *plan, model.at(have), pool);
    ASSERT_TRUE(applied.ok()) << applied.status().ToString();
    EXPECT_EQ(*applied, BytesOf(model.at(4)));
  }
  EXPECT_EQ(Publish(*board, 9).status().code(), Code::kAlreadyExists);
  EXPECT_EQ(Publish(*board, 1, supersede).status().code(), Code::kAlreadyExists);  // 1 is taken
  ASSERT_TRUE(Publish(*board, 5).ok());
  // Retention: everything of epoch 0 (9 included, though its number is
  // higher) lies before the newest keyframe, keyframe(3).
  ASSERT_TRUE(board->SetOptions({1, 32}).ok());
  ASSERT_TRUE(board->Retain({}).ok());
  EXPECT_FALSE(board->PosOf(9).ok());
  EXPECT_FALSE(board->PosOf(2).ok());
  EXPECT_TRUE(board->PosOf(3).ok());
  board.reset();
  board = MustOpen(*env);
  EXPECT_EQ(board->head_pos(), (BoardPos{1, 5}));
  auto plan = board->PlanCatchUp(0, 5);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  auto applied = ApplyPlan(*env, *board, verifier, *plan, model.at(0), pool);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(*applied, BytesOf(model.at(5)));
}

// What Record refuses before anything reaches the log: a supersede signed by
// a key the board does not trust, one that skips an epoch, an epoch-1
// publication without the flag, the supersede recorded twice, a later
// manifest of another epoch. A restart refuses a log whose epochs break the
// rules (an epoch opened without the flag).
TEST_F(BoardTest, SupersedeRulesAreCheckedBeforeTheLog) {
  for (int i = 0; i < 9; ++i) model.Next(20, 1000);
  auto board = MustOpen(*env);
  for (uint64_t v : {1, 2, 9}) ASSERT_TRUE(Publish(*board, v).ok()) << v;
  const ServeView prev = model.at(9).View(), next = model.at(3).View();
  auto patch = Diff(prev, next, DiffOptions{1 << 20, 9, 3}, pool);
  ASSERT_TRUE(patch.ok());
  auto keyframe = Diff(model.at(0).View(), next, DiffOptions{1 << 20, 0, 3}, pool);
  ASSERT_TRUE(keyframe.ok());
  auto pdesc = DescribeObject({ObjectKind::kPatch, 9, 3}, *patch, 4096, pool);
  auto kdesc = DescribeObject({ObjectKind::kKeyframe, 3, 3}, *keyframe, 4096, pool);
  ASSERT_TRUE(pdesc.ok() && kdesc.ok());
  ASSERT_TRUE(WriteNewFile(*env, board->ObjectPath({ObjectKind::kPatch, 9, 3}), *patch).ok());
  ASSERT_TRUE(WriteNewFile(*env, board->ObjectPath({ObjectKind::kKeyframe, 3, 3}), *keyframe).ok());
  VersionManifest m;
  m.board_id = board->id();
  m.version = 3;
  m.parent = 9;
  m.epoch = 1;
  m.supersede = true;
  m.base_digest = board->Manifest(9)->target_digest;
  m.target_digest = ComputeDigest(next, pool);
  m.objects = {*pdesc, *kdesc};

  const ManifestSigner stranger = testing::SignerFromByte(77);
  EXPECT_EQ(board->Record(*stranger.Sign(m)).code(), Code::kAuth);
  VersionManifest skip = m;
  skip.epoch = 2;
  EXPECT_EQ(board->Record(*signer.Sign(skip)).code(), Code::kInvalidArgument);
  VersionManifest unflagged = m;  // epoch 1 above HEAD, without the flag
  unflagged.supersede = false;
  unflagged.version = 10;
  unflagged.objects = {*pdesc};
  unflagged.objects[0].to_version = 10;
  EXPECT_EQ(board->Record(*signer.Sign(unflagged)).code(), Code::kInvalidArgument);
  EXPECT_EQ(board->head_pos(), (BoardPos{0, 9}));

  ASSERT_TRUE(board->Record(*signer.Sign(m)).ok());
  EXPECT_EQ(board->head_pos(), (BoardPos{1, 3}));
  EXPECT_EQ(board->Record(*signer.Sign(m)).code(), Code::kAlreadyExists);
  // A later manifest of 9 (epoch 0) in epoch 1: refused, not appended.
  VersionManifest later = *board->Manifest(9);
  later.epoch = 1;
  later.objects = {*pdesc};
  later.objects[0].kind = ObjectKind::kSquash;
  later.objects[0].from_version = 1;
  later.objects[0].to_version = 9;
  EXPECT_EQ(board->Record(*signer.Sign(later)).code(), Code::kMismatch);
  EXPECT_EQ(board->SignedManifests(9).size(), 1u);
  board.reset();

  // Forged into the log directly: epoch 2 opened by an ordinary publication.
  {
    auto log = OpenFileBoardLog(*env, "/root/board").value();
    VersionManifest forged = unflagged;
    forged.epoch = 2;
    forged.version = 11;
    forged.parent = 3;
    forged.base_digest = m.target_digest;
    forged.objects[0].from_version = 3;
    forged.objects[0].to_version = 11;
    ASSERT_TRUE(log->Append({2, 11}, 0, *signer.Sign(forged), true, {1, 3}).ok());
  }
  auto reopened = Open(*env);
  ASSERT_FALSE(reopened.ok());
  EXPECT_EQ(reopened.status().code(), Code::kMismatch) << reopened.status().ToString();
  EXPECT_NE(reopened.status().message().find("11/0"), std::string::npos)
      << reopened.status().ToString();
}

TEST_F(BoardTest, HostileLogRecordsAreRefused) {
  VersionManifest m;  // of board 00..00, which CannedLog claims
  m.version = 1;
  m.objects.push_back({ObjectKind::kKeyframe, 1, 1, 10, 4, 3, {}});
  const std::string good = *signer.Sign(m);
  ASSERT_TRUE(Board::Open(*env, "/root/objects",
                          std::make_unique<CannedLog>(std::vector<BoardRecord>{{1, 0, good}}),
                          verifier, {}, [](std::string_view) {})
                  .ok());
  const std::vector<std::vector<BoardRecord>> cases = {
      {{1, 0, good}, {1, uint32_t{1} << 31, good}},  // a seq no log may hold
      {{1, uint32_t{1} << 31, "x"}},
      {{0, 0, "x"}},
      {{1, 0, std::string(100000, 'x')}},
      {{1, 0, ""}},
      {},  // HEAD 1 without its record
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    auto board = Board::Open(*env, "/root/objects", std::make_unique<CannedLog>(cases[i]),
                             verifier, {}, [](std::string_view) {});
    ASSERT_FALSE(board.ok());
    EXPECT_EQ(board.status().code(), Code::kCorrupt) << board.status().ToString();
  }
}

// Every write, sync and rename of a publish fails in turn, short writes
// included: a restart finds version 2 wholly published or not at all, no
// stray object files, and publishing goes on.
TEST_F(BoardTest, CrashAtEveryStepOfAPublish) {
  for (int kind = 0; kind < 3; ++kind) {
    for (uint64_t nth = 1; nth <= 8; ++nth) {
      SCOPED_TRACE(::testing::Message() << "kind " << kind << " nth " << nth);
      auto mem = NewMemEnv();
      model = Model();
      for (int i = 0; i < 3; ++i) model.Next(30, 1000);
      {
        auto board = MustOpen(*mem);
        ASSERT_TRUE(Publish(*board, 1).ok());
      }
      EnvFaultPolicy policy;
      policy.seed = nth;
      policy.short_writes = true;
      (kind == 0 ? policy.fail_write_nth : kind == 1 ? policy.fail_sync_nth
                                                     : policy.fail_rename_nth) = nth;
      FaultEnv faulty(*mem, policy);
      Status st;
      {
        auto board = Open(faulty, {.keep_patches = 16, .keyframe_every = 1});
        ASSERT_TRUE(board.ok()) << board.status().ToString();
        st = Publish(**board, 2).status();  // a patch and a keyframe: two objects, one record
      }
      auto board = Open(*mem, {.keep_patches = 16, .keyframe_every = 1});
      ASSERT_TRUE(board.ok()) << board.status().ToString();
      const uint64_t head = (*board)->head();
      ASSERT_TRUE(head == 1 || head == 2) << head;
      if (faulty.stats().failed == 0) {
        EXPECT_TRUE(st.ok()) << st.ToString();
      }
      auto names = *mem->ListDir("/root/objects", 100);
      if (head == 1) {
        EXPECT_EQ(names, std::vector<std::string>{"keyframe-1-1"});
        ASSERT_TRUE(Publish(**board, 2).ok());
      } else {
        EXPECT_EQ(names.size(), 3u);
      }
      auto plan = (*board)->PlanCatchUp(1, 2);
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      auto applied = ApplyPlan(*mem, **board, verifier, *plan, model.at(1), pool);
      ASSERT_TRUE(applied.ok()) << applied.status().ToString();
      EXPECT_EQ(*applied, BytesOf(model.at(2)));
      ASSERT_TRUE(Publish(**board, 3).ok());
    }
  }
}

TEST_F(BoardTest, KeyframeEveryMVersions) {
  auto board = MustOpen(*env, {.keep_patches = 16, .keyframe_every = 3});
  std::vector<uint64_t> keyframes;
  for (uint64_t v = 1; v <= 8; ++v) {
    model.Next(5, 100);
    auto r = Publish(*board, v);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (r->keyframe_bytes > 0) keyframes.push_back(v);
  }
  EXPECT_EQ(keyframes, (std::vector<uint64_t>{1, 4, 7}));
}

TEST_F(BoardTest, KeyframeWhenTheChainOutweighsIt) {
  auto board = MustOpen(*env, {.keep_patches = 16, .keyframe_every = 1000});
  uint64_t keyframe_bytes = 0, chain = 0;
  for (uint64_t v = 1; v <= 6; ++v) {
    model.Next(6000, 1 << 20);  // large patches: ~ a third of a keyframe each
    auto r = Publish(*board, v);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (v == 1) {
      keyframe_bytes = r->keyframe_bytes;
      continue;
    }
    const bool due = chain + r->patch_bytes > keyframe_bytes;
    EXPECT_EQ(r->keyframe_bytes > 0, due) << "v " << v;
    chain = due ? 0 : chain + r->patch_bytes;
    if (due) keyframe_bytes = r->keyframe_bytes;
  }
  EXPECT_GE(board->SignedManifests(1).size(), 1u);
  int keyframes = 0;
  for (uint64_t v = 2; v <= 6; ++v) keyframes += board->HasObject({ObjectKind::kKeyframe, v, v});
  EXPECT_GE(keyframes, 1);
  EXPECT_LT(keyframes, 5);
}

TEST_F(BoardTest, ReadersRunWhilePublishing) {
  auto board = MustOpen(*env);
  model.Next(20, 1000);
  ASSERT_TRUE(Publish(*board, 1).ok());
  for (int i = 0; i < 8; ++i) model.Next(20, 1000);
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done) {
      const uint64_t h = board->head();
      auto plan = board->PlanCatchUp(0, h);
      EXPECT_TRUE(plan.ok()) << plan.status().ToString();
      EXPECT_TRUE(board->Manifest(h).ok());
      EXPECT_FALSE(board->SignedManifests(h).empty());
    }
  });
  for (uint64_t v = 2; v <= 9; ++v) EXPECT_TRUE(Publish(*board, v).ok());
  done = true;
  reader.join();
}

}  // namespace
}  // namespace tern::agent
