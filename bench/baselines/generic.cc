#include "bench/baselines/generic.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

extern char** environ;

namespace tern::bench {

Result<uint64_t> ZstdXorBytes(std::span<const uint8_t> old_bytes,
                              std::span<const uint8_t> new_bytes, int level,
                              std::vector<uint8_t>* out) {
  TERN_REQUIRE(old_bytes.size() == new_bytes.size(), kMismatch, "zstd-xor: old has ",
               old_bytes.size(), " bytes, new ", new_bytes.size());
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(), ZSTD_freeCCtx);
  TERN_REQUIRE(cctx, kResourceExhausted, "zstd-xor: cannot create a context");
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
  // Same parameters as a one-shot `zstd -3` of the whole XOR buffer.
  ZSTD_CCtx_setPledgedSrcSize(cctx.get(), old_bytes.size());

  constexpr size_t kSlice = size_t{1} << 20;
  std::vector<uint8_t> x(kSlice);
  std::vector<uint8_t> buf(ZSTD_CStreamOutSize());
  uint64_t total = 0;
  if (out) out->clear();
  auto drain = [&](ZSTD_inBuffer& in, ZSTD_EndDirective mode) -> Result<bool> {
    for (;;) {
      ZSTD_outBuffer o{buf.data(), buf.size(), 0};
      const size_t left = ZSTD_compressStream2(cctx.get(), &o, &in, mode);
      TERN_REQUIRE(!ZSTD_isError(left), kInternal, "zstd-xor: ", ZSTD_getErrorName(left));
      total += o.pos;
      if (out) out->insert(out->end(), buf.data(), buf.data() + o.pos);
      const bool done = mode == ZSTD_e_end ? left == 0 : in.pos == in.size;
      if (done) return true;
    }
  };
  for (size_t off = 0; off < old_bytes.size(); off += kSlice) {
    const size_t n = std::min(kSlice, old_bytes.size() - off);
    for (size_t i = 0; i < n; ++i) x[i] = old_bytes[off + i] ^ new_bytes[off + i];
    ZSTD_inBuffer in{x.data(), n, 0};
    TERN_ASSIGN_OR_RETURN(bool ok, drain(in, ZSTD_e_continue));
    (void)ok;
  }
  ZSTD_inBuffer empty{nullptr, 0, 0};
  TERN_ASSIGN_OR_RETURN(bool ok, drain(empty, ZSTD_e_end));
  (void)ok;
  return total;
}

namespace {

Status WriteFile(const std::string& path, std::span<const uint8_t> bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return TERN_ERRNO("open ", path);
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      Status s = TERN_ERRNO("write ", path);
      ::close(fd);
      return s;
    }
    off += size_t(n);
  }
  if (::close(fd) != 0) return TERN_ERRNO("close ", path);
  return Status::Ok();
}

Status Run(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0)
    return TERN_ERROR(kUnavailable, "cannot run ", args[0], ": ", std::strerror(err));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return TERN_ERRNO("waitpid ", args[0]);
  TERN_REQUIRE(WIFEXITED(status) && WEXITSTATUS(status) == 0, kUnavailable, args[0],
               " failed (status ", status, ")");
  return Status::Ok();
}

}  // namespace

Result<uint64_t> Xdelta3Bytes(std::span<const uint8_t> old_bytes, std::span<const uint8_t> new_bytes,
                              const std::string& tmp_dir,
                              const std::vector<std::string>& extra_args, bool check_roundtrip) {
  std::string templ = tmp_dir + "/tern-xdelta-XXXXXX";
  TERN_REQUIRE(::mkdtemp(templ.data()) != nullptr, kIo, "mkdtemp ", templ, ": ",
               std::strerror(errno));
  const std::string dir = templ;
  const std::string old_path = dir + "/old", new_path = dir + "/new", delta_path = dir + "/delta",
                    back_path = dir + "/back";
  auto cleanup = [&] {
    for (const auto& p : {old_path, new_path, delta_path, back_path}) ::unlink(p.c_str());
    ::rmdir(dir.c_str());
  };
  auto body = [&]() -> Result<uint64_t> {
    TERN_RETURN_IF_ERROR(WriteFile(old_path, old_bytes));
    TERN_RETURN_IF_ERROR(WriteFile(new_path, new_bytes));
    std::vector<std::string> args = {"xdelta3", "-e", "-f"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    args.insert(args.end(), {"-s", old_path, new_path, delta_path});
    TERN_RETURN_IF_ERROR(Run(args));
    struct stat st{};
    TERN_REQUIRE(::stat(delta_path.c_str(), &st) == 0, kIo, "stat ", delta_path);
    if (check_roundtrip) {
      TERN_RETURN_IF_ERROR(Run({"xdelta3", "-d", "-f", "-s", old_path, delta_path, back_path}));
      const int fd = ::open(back_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) return TERN_ERRNO("open ", back_path);
      std::vector<uint8_t> back(new_bytes.size() + 1);
      size_t got = 0;
      for (ssize_t n; (n = ::read(fd, back.data() + got, back.size() - got)) > 0;) got += size_t(n);
      ::close(fd);
      TERN_REQUIRE(got == new_bytes.size() && std::equal(new_bytes.begin(), new_bytes.end(),
                                                         back.begin()),
                   kInternal, "xdelta3 round trip differs");
    }
    return uint64_t(st.st_size);
  };
  Result<uint64_t> r = body();
  cleanup();
  return r;
}

}  // namespace tern::bench
