// `tern datagen` end to end: the binary writes version directories that sort
// in version order, hold exactly the generator's views, and refuses what it
// should.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tern/thread_pool.h"
#include "tern/checkpoint.h"
#include "tern/datagen.h"

namespace tern {
namespace {

namespace fs = std::filesystem;

struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Every version under `out` holds exactly the generator's view for `config`,
// and a config.json that holds every member of `config_has`.
void ExpectTraceMatches(const fs::path& out, const std::vector<std::string>& names,
                        const TraceConfig& config, const nlohmann::json& config_has) {
  ThreadPool pool(1);
  auto gen = TraceGenerator::Create(config, pool);
  ASSERT_TRUE(gen.ok()) << gen.status().ToString();
  for (size_t version = 0; version < names.size(); ++version) {
    if (version > 0) {
      ASSERT_TRUE((*gen)->Step().ok());
    }
    const fs::path dir = out / names[version];
    auto ckpt = Checkpoint::Open(dir.string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    // The name order is the version order.
    const auto& files = (*ckpt)->files();
    ASSERT_FALSE(files.empty());
    const auto& metadata = (*ckpt)->metadata(files[0]);
    ASSERT_TRUE(metadata.count("tern.trace.step"));
    EXPECT_EQ(metadata.at("tern.trace.step"), std::to_string(version));
    EXPECT_EQ(metadata.at("format"), "pt");

    const ServeView& want = (*gen)->view();
    const ServeView& got = (*ckpt)->view();
    ASSERT_EQ(got.tensors.size(), want.tensors.size());
    for (size_t i = 0; i < want.tensors.size(); ++i) {
      ASSERT_TRUE(got.tensors[i].desc->SameLayout(*want.tensors[i].desc))
          << got.tensors[i].desc->name;
      EXPECT_EQ(0, std::memcmp(got.tensors[i].data, want.tensors[i].data,
                               want.tensors[i].desc->bytes()))
          << names[version] << " " << want.tensors[i].desc->name;
    }
    std::ifstream config_json(dir / "config.json");
    std::stringstream text;
    text << config_json.rdbuf();
    const auto parsed = nlohmann::json::parse(text.str());
    EXPECT_EQ(parsed.at("hidden_size"), config.shape.hidden_size);
    for (const auto& [key, value] : config_has.items()) EXPECT_EQ(parsed.at(key), value) << key;
  }
}

class DatagenCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "tern-datagen-XXXXXX").string();
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  RunResult Run(const std::string& args) {
    const std::string log = (root_ / "log.txt").string();
    const std::string cmd = std::string(TERN_CLI_PATH) + " datagen " + args + " >" + log + " 2>&1";
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    r.output = text.str();
    return r;
  }

  std::vector<std::string> Entries(const fs::path& dir) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path root_;
};

TEST_F(DatagenCliTest, WritesVersionsThatSortInOrderAndMatchTheGenerator) {
  const fs::path out = root_ / "trace";
  RunResult r = Run("--out " + out.string() + " --params 200K --steps 2 --seed 3 --threads 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step 1: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("values changed (bf16)"), std::string::npos) << r.output;

  const std::vector<std::string> names = Entries(out);
  ASSERT_EQ(names, (std::vector<std::string>{"step-000000", "step-000001", "step-000002"}));

  TraceConfig config;
  config.shape = *ChooseModelShape(200'000);
  config.seed = 3;
  ExpectTraceMatches(out, names, config, {{"torch_dtype", "bfloat16"}});
}

TEST_F(DatagenCliTest, QuantizedFormatsWriteTheCastLayoutAndItsConfig) {
  for (const std::string policy : {"band", "fresh"}) {
    for (const std::string format : {"nvfp4", "fp8-e4m3-block128", "gptq-int4-g128"}) {
      const fs::path out = root_ / (format + "-" + policy);
      // 400K: hidden and intermediate sizes divisible by every group.
      RunResult r = Run("--out " + out.string() + " --params 400K --steps 2 --seed 3 --lr 1e-5 " +
                        "--threads 2 --format " + format + " --scale-policy " + policy);
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find("values changed (" + format + ")"), std::string::npos) << r.output;
      EXPECT_NE(r.output.find("scale groups re-scaled"), std::string::npos) << r.output;
      EXPECT_EQ(r.output.find("unquantized"), std::string::npos) << r.output;
      TraceConfig config;
      config.shape = *ChooseModelShape(400'000);
      config.seed = 3;
      config.adam.lr = 1e-5;
      config.format = ServeFormat::kQuantized;
      config.quant = *ParseQuantFormat(format);
      if (policy == "fresh") config.scale_policy.kind = ScalePolicy::Kind::kFresh;
      ExpectTraceMatches(out, Entries(out), config,
                         {{"quantization_config",
                           nlohmann::json::parse(QuantizationConfigJson(config.quant))}});
    }
  }
}

TEST_F(DatagenCliTest, ExpertsWriteAnMoeWhoseExpertsTakeMxfp4) {
  const fs::path out = root_ / "moe";
  RunResult r = Run("--out " + out.string() +
                    " --params 400K --experts 4 --steps 1 --seed 3 --threads 2 --format mxfp4");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("scale groups re-scaled"), std::string::npos) << r.output;
  TraceConfig config;
  config.shape = *ChooseModelShape(400'000, 4);
  config.seed = 3;
  config.format = ServeFormat::kQuantized;
  config.quant = *ParseQuantFormat("mxfp4");
  ExpectTraceMatches(out, Entries(out), config,
                     {{"num_local_experts", 4},
                      {"architectures", nlohmann::json::array({"TernSyntheticMoeForCausalLM"})}});
}

TEST_F(DatagenCliTest, SaysWhichTensorsAFormatCannotQuantize) {
  // 200K: hidden 64, which 128-groups cannot take.
  RunResult r = Run("--stats-only --params 200K --steps 1 --threads 1 --format int4-g128");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("kept unquantized"), std::string::npos) << r.output;
}

TEST_F(DatagenCliTest, DtypeIsAnAliasOfFormat) {
  const fs::path out = root_ / "f16";
  RunResult r = Run("--out " + out.string() + " --params 200K --steps 1 --threads 1 --dtype fp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("values changed (fp16)"), std::string::npos) << r.output;
  TraceConfig config;
  config.shape = *ChooseModelShape(200'000);
  config.format = ServeFormat::kF16;
  ExpectTraceMatches(out, Entries(out), config, {{"torch_dtype", "float16"}});
}

TEST_F(DatagenCliTest, RefusesANonEmptyDirectoryUnlessForced) {
  const fs::path out = root_ / "trace";
  const std::string base = "--out " + out.string() + " --params 200K --threads 1";
  ASSERT_EQ(Run(base + " --steps 2").exit_code, 0);
  std::ofstream(out / "notes.txt") << "keep me";

  RunResult again = Run(base + " --steps 1");
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_NE(again.output.find("not empty"), std::string::npos) << again.output;
  EXPECT_EQ(Entries(out).size(), 4u);

  RunResult forced = Run(base + " --steps 1 --force");
  ASSERT_EQ(forced.exit_code, 0) << forced.output;
  // The old trace's versions are replaced, foreign files are left alone.
  EXPECT_EQ(Entries(out), (std::vector<std::string>{"notes.txt", "step-000000", "step-000001"}));
}

TEST_F(DatagenCliTest, BadUsageIsAOneLineErrorWithExitStatus2) {
  const std::string out = "--out " + (root_ / "x").string();
  for (const std::string& args :
       {out + " --params lots", out + " --dtype fp8", out + " --lr -1", out + " --params 10",
        out + " --format fp9", out + " --format nvfp4 --scale-policy sometimes",
        out + " --format nvfp4 --dtype fp16", std::string("--params 1M"), out + " --beta2 1",
        out + " --experts 1025"}) {
    RunResult r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find("tern datagen: "), std::string::npos) << args << "\n" << r.output;
  }
  EXPECT_FALSE(fs::exists(root_ / "x"));
  RunResult help = Run("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--weight-decay"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace tern
