// Tests of the config system (train/config): defaults, precedence (defaults < file < command
// line), `extends` chains, every error class with its message (file, line, key, suggestion),
// dotted sections ([quantize.linear.float8]) in files and flags, --print-config round trips,
// that every shipped configs/*.toml loads, and that a warmup longer than the run is clamped with
// a warning (make_lr_scheduler).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/core/error.h"
#include "runtime/ops/factory.h"
#include "runtime/optim/lr_scheduler.h"
#include "runtime/optim/optimizer.h"
#include "tests/testing/errors.h"
#include "train/config/load.h"
#include "train/config/schema.h"
#include "train/config/suggest.h"
#include "train/optimizer_setup.h"

namespace mt::train::config {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// A fresh folder per test (ctest runs tests in parallel processes), removed at the end.
class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("mt_config_test_" + std::string(info->name()) + "_" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `text` to dir/name (line 1 = the first line of text) and returns the path.
  fs::path write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
    return path;
  }
  std::string at(const std::string& name, int line) {
    return (dir_ / name).string() + " line " + std::to_string(line);
  }

  fs::path dir_;
};

// The message of the mt::Error that `f` throws ("" and a failure when it throws none).
using mt::testing::error_of;

JobConfig load_args(const std::vector<std::string>& args) {
  return load_config(parse_command_line(args));
}

// ---------------------------------------------------------------------------------------------
// Defaults and the schema

TEST_F(ConfigTest, DefaultsAreTorchtitans) {
  const JobConfig d;
  EXPECT_EQ(d.job.dump_folder, "./outputs");
  EXPECT_EQ(d.model.name, "llama3");
  EXPECT_EQ(d.model.flavor, "debugmodel");
  EXPECT_EQ(d.optimizer.name, "AdamW");
  EXPECT_DOUBLE_EQ(d.optimizer.lr, 8e-4);
  EXPECT_DOUBLE_EQ(d.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(d.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(d.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(d.optimizer.beta2, 0.95);
  EXPECT_EQ(d.lr_scheduler.warmup_steps, 200);
  EXPECT_EQ(d.lr_scheduler.decay_type, "linear");
  EXPECT_DOUBLE_EQ(d.lr_scheduler.min_lr_factor, 0.0);
  EXPECT_EQ(d.training.local_batch_size, 8);
  EXPECT_EQ(d.training.global_batch_size, -1);
  EXPECT_EQ(d.training.seq_len, 2048);
  EXPECT_EQ(d.training.steps, 10000);
  EXPECT_DOUBLE_EQ(d.training.max_norm, 1.0);
  EXPECT_EQ(d.training.mixed_precision_param, "bfloat16");
  EXPECT_EQ(d.training.mixed_precision_reduce, "float32");
  EXPECT_FALSE(d.training.deterministic);
  EXPECT_EQ(d.parallelism.data_parallel_replicate_degree, 1);
  EXPECT_EQ(d.parallelism.data_parallel_shard_degree, -1);
  EXPECT_EQ(d.parallelism.expert_parallel_degree, 1);
  EXPECT_FALSE(d.checkpoint.enable);
  EXPECT_EQ(d.checkpoint.folder, "checkpoint");
  EXPECT_EQ(d.checkpoint.interval, 500);
  EXPECT_EQ(d.checkpoint.keep_latest_k, 10);
  EXPECT_EQ(d.checkpoint.load_step, -1);
  EXPECT_EQ(d.checkpoint.async_mode, "disabled");
  EXPECT_EQ(d.checkpoint.export_dtype, "float32");
  EXPECT_TRUE(d.checkpoint.exclude_from_loading.empty());
  EXPECT_EQ(d.activation_checkpoint.mode, "selective");
  EXPECT_EQ(d.metrics.log_freq, 10);
  EXPECT_FALSE(d.profiling.enable);
  EXPECT_EQ(d.profiling.profile_freq, 10);
  EXPECT_FALSE(d.validation.enable);
  EXPECT_EQ(d.validation.steps, -1);
  EXPECT_EQ(d.comm.timeout_seconds, 300);
  EXPECT_FALSE(d.float8.enable);
  EXPECT_EQ(d.float8.recipe_name, "tensorwise");
  EXPECT_EQ(d.float8.filter_fqns, StringList{"output"});
  EXPECT_FALSE(d.float8.emulate);

  // No file and no flags: the defaults, valid, with no origins.
  const JobConfig loaded = load_config(CommandLine{});
  EXPECT_EQ(loaded, d);
  EXPECT_TRUE(loaded.origins.empty());
  EXPECT_EQ(loaded.where("training.steps"), "default value");
  EXPECT_NO_THROW(validate(d));
}

TEST_F(ConfigTest, SchemaIsComplete) {
  const JobConfig defaults;
  std::set<std::string> sections, keys;
  for (const SectionSpec& s : schema()) {
    EXPECT_TRUE(sections.insert(std::string(s.name)).second) << s.name;
    EXPECT_FALSE(s.doc.empty()) << s.name;
    for (const FieldSpec& f : s.fields) {
      EXPECT_TRUE(keys.insert(f.key()).second) << f.key();
      EXPECT_FALSE(f.doc.empty()) << f.key();
      EXPECT_EQ(f.section, s.name);
      EXPECT_EQ(find_field(f.key()), &f);
      EXPECT_EQ(f.get(defaults).index(), static_cast<size_t>(f.type)) << f.key();
      EXPECT_TRUE(f.check.passes(f.get(defaults))) << f.key() << " default breaks its rule";
    }
  }
  for (const char* s : {"job", "model", "optimizer", "lr_scheduler", "training", "parallelism",
                        "checkpoint", "activation_checkpoint", "metrics", "profiling", "validation",
                        "embedding", "comm", "quantize.linear.float8"}) {
    EXPECT_TRUE(sections.count(s)) << s;
  }
  EXPECT_GE(keys.size(), 50u);
  EXPECT_EQ(find_field("training"), nullptr);
  EXPECT_EQ(find_field("training.nope"), nullptr);
  // Dotted section names: the key is after the last dot; the leading parts are groups.
  ASSERT_NE(find_field("quantize.linear.float8.enable"), nullptr);
  EXPECT_EQ(find_field("quantize.linear.float8.enable")->section, "quantize.linear.float8");
  EXPECT_EQ(find_field("quantize.linear.enable"), nullptr);
  EXPECT_EQ(find_field("quantize.linear.float8"), nullptr);
  EXPECT_TRUE(is_section_group("quantize"));
  EXPECT_TRUE(is_section_group("quantize.linear"));
  EXPECT_FALSE(is_section_group("quantize.linear.float8"));
  EXPECT_FALSE(is_section_group("quant"));
  EXPECT_FALSE(is_section_group("training"));
}

TEST_F(ConfigTest, EqualityComparesEveryKeyButNotOrigins) {
  const JobConfig defaults;
  for (const SectionSpec& s : schema()) {
    for (const FieldSpec& f : s.fields) {
      JobConfig changed;
      Value v = f.get(changed);
      std::visit(
          [](auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, bool>)
              x = !x;
            else if constexpr (std::is_same_v<T, StringList>)
              x.push_back("z");
            else if constexpr (std::is_same_v<T, std::string>)
              x += "z";
            else
              x = x + 1;
          },
          v);
      f.set(changed, v);
      EXPECT_NE(changed, defaults) << f.key();
    }
  }
  JobConfig with_origin;
  with_origin.origins["training.steps"] = Origin{"x.toml", 3, ""};
  EXPECT_EQ(with_origin, defaults);
}

TEST_F(ConfigTest, HelpListsEveryKeyWithDefaultRuleAndDoc) {
  const std::string help = help_text();
  for (const SectionSpec& s : schema()) {
    EXPECT_THAT(help, HasSubstr(std::string("[").append(s.name).append("]")));
    for (const FieldSpec& f : s.fields) {
      EXPECT_THAT(help, HasSubstr("--" + f.key() + "=" + std::string(placeholder(f.type))));
      EXPECT_THAT(help, HasSubstr(std::string(f.doc)));
    }
  }
  EXPECT_THAT(help, HasSubstr("--training.steps=INT  (default 10000; > 0)"));
  EXPECT_THAT(help, HasSubstr("one of \"linear\", \"sqrt\", \"cosine\""));
}

// ---------------------------------------------------------------------------------------------
// Precedence: defaults < file < command line

TEST_F(ConfigTest, FileOverridesDefaults) {
  const fs::path file = write("x.toml",
                              "[training]\n"
                              "steps = 500\n"
                              "seq_len = 64\n"
                              "\n"
                              "[optimizer]\n"
                              "lr = 1  # an integer is accepted as a number\n"
                              "\n"
                              "[checkpoint]\n"
                              "exclude_from_loading = [\"optimizer\", \"dataloader\"]\n");
  const JobConfig c = load_config(file);
  EXPECT_EQ(c.training.steps, 500);
  EXPECT_EQ(c.training.seq_len, 64);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1.0);
  EXPECT_EQ(c.checkpoint.exclude_from_loading, (StringList{"optimizer", "dataloader"}));
  EXPECT_EQ(c.training.local_batch_size, 8);  // untouched keys keep their defaults
  EXPECT_EQ(c.optimizer.name, "AdamW");
  EXPECT_EQ(c.where("training.steps"), at("x.toml", 2));
  EXPECT_EQ(c.where("optimizer.lr"), at("x.toml", 6));
  EXPECT_EQ(c.where("training.local_batch_size"), "default value");
}

TEST_F(ConfigTest, CommandLineOverridesFileInBothForms) {
  const fs::path file = write("x.toml",
                              "[training]\nsteps = 50\nseq_len = 64\n"
                              "[lr_scheduler]\nwarmup_steps = 1\n");
  const std::string config = file.string();
  JobConfig c = load_args({"--config", config, "--training.steps=70"});
  EXPECT_EQ(c.training.steps, 70);
  EXPECT_EQ(c.training.seq_len, 64);
  EXPECT_EQ(c.where("training.steps"), "command-line flag --training.steps=70");

  c = load_args({"--config=" + config, "--training.steps", "80"});
  EXPECT_EQ(c.training.steps, 80);
  EXPECT_EQ(c.where("training.steps"), "command-line flag --training.steps 80");

  // The later of two overrides of one key wins; the flags may come before --config.
  c = load_args({"--training.steps=1", "--config", config, "--training.steps", "2"});
  EXPECT_EQ(c.training.steps, 2);

  // Overrides without a file apply onto the defaults.
  c = load_args({"--optimizer.lr", "0.5"});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.5);
  EXPECT_EQ(c.training.steps, 10000);
}

TEST_F(ConfigTest, CommandLineValuesFollowTheKeyType) {
  const JobConfig c = load_args({
      "--checkpoint.enable=true",
      "--training.deterministic",
      "false",
      "--checkpoint.load_step",
      "-1",  // a negative number is a value, not a flag
      "--checkpoint.interval=7",
      "--optimizer.lr=3e-4",
      "--optimizer.beta2",
      "0.99",
      "--model.flavor=8B",
      "--job.description=a b=c, d",  // strings are taken as written
      "--model.tokenizer_path",
      "\"quoted \\\"path\\\"\"",
      "--checkpoint.exclude_from_loading=optimizer, lr_scheduler",
  });
  EXPECT_TRUE(c.checkpoint.enable);
  EXPECT_FALSE(c.training.deterministic);
  EXPECT_EQ(c.checkpoint.load_step, -1);
  EXPECT_EQ(c.checkpoint.interval, 7);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.99);
  EXPECT_EQ(c.model.flavor, "8B");
  EXPECT_EQ(c.job.description, "a b=c, d");
  EXPECT_EQ(c.model.tokenizer_path, "quoted \"path\"");
  EXPECT_EQ(c.checkpoint.exclude_from_loading, (StringList{"optimizer", "lr_scheduler"}));

  // Lists also in TOML array syntax (items may hold commas), and empty.
  EXPECT_EQ(load_args({"--checkpoint.exclude_from_loading", "[\"a,b\", 'c']"})
                .checkpoint.exclude_from_loading,
            (StringList{"a,b", "c"}));
  const fs::path file = write("x.toml", "[checkpoint]\nexclude_from_loading = [\"x\"]\n");
  EXPECT_TRUE(load_args({"--config", file.string(), "--checkpoint.exclude_from_loading="})
                  .checkpoint.exclude_from_loading.empty());
  EXPECT_TRUE(
      load_args({"--checkpoint.exclude_from_loading=[]"}).checkpoint.exclude_from_loading.empty());
}

TEST_F(ConfigTest, CommandLineOptions) {
  CommandLine cl = parse_command_line({"--config", "a.toml", "--print-config"});
  EXPECT_EQ(cl.config_file, "a.toml");
  EXPECT_TRUE(cl.print_config);
  EXPECT_FALSE(cl.help);
  EXPECT_TRUE(cl.overrides.empty());
  EXPECT_TRUE(parse_command_line({"--help"}).help);
  EXPECT_TRUE(parse_command_line({"-h"}).help);
  const char* argv[] = {"train", "--config=b.toml", "--training.steps", "3"};
  cl = parse_command_line(4, argv);
  EXPECT_EQ(cl.config_file, "b.toml");
  ASSERT_EQ(cl.overrides.size(), 1u);
  EXPECT_EQ(cl.overrides[0].key, "training.steps");
  EXPECT_EQ(std::get<int64_t>(cl.overrides[0].value), 3);
  EXPECT_EQ(cl.overrides[0].flag, "--training.steps 3");
}

// ---------------------------------------------------------------------------------------------
// extends

TEST_F(ConfigTest, ExtendsChainWithRelativePaths) {
  write("base/root.toml",
        "[training]\n"
        "steps = 10\n"
        "seq_len = 32\n"
        "[optimizer]\n"
        "lr = 0.01\n"
        "[lr_scheduler]\n"
        "warmup_steps = 2\n");
  write("base/mid.toml",
        "extends = \"root.toml\"  # relative to base/\n"
        "[training]\n"
        "seq_len = 128\n");
  const fs::path leaf = write("configs/leaf.toml",
                              "extends = \"../base/mid.toml\"\n"
                              "\n"
                              "[optimizer]\n"
                              "lr = 0.02\n");
  JobConfig c = load_config(leaf);
  EXPECT_EQ(c.training.steps, 10);         // from root
  EXPECT_EQ(c.training.seq_len, 128);      // mid overlays root
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.02);  // leaf overlays both
  EXPECT_EQ(c.training.local_batch_size, 8);
  EXPECT_EQ(c.where("training.steps"), at("base/root.toml", 2));
  EXPECT_EQ(c.where("training.seq_len"), at("base/mid.toml", 3));
  EXPECT_EQ(c.where("optimizer.lr"), at("configs/leaf.toml", 4));

  // The command line still wins over the whole chain.
  c = load_config(leaf, {"--training.steps=99"});
  EXPECT_EQ(c.training.steps, 99);
  EXPECT_EQ(c.training.seq_len, 128);

  // A value invalid in a base is fine when the extension replaces it (rules check the result).
  write("bad_base.toml", "[training]\nsteps = -1\n");
  const fs::path fixed =
      write("fixed.toml", "extends = \"bad_base.toml\"\n[training]\nsteps = 500\n");
  EXPECT_EQ(load_config(fixed).training.steps, 500);
}

TEST_F(ConfigTest, ExtendsCycleIsAnErrorNamingTheChain) {
  const fs::path a = write("a.toml", "extends = \"b.toml\"\n");
  write("b.toml", "extends = \"c.toml\"\n");
  write("c.toml", "[training]\nsteps = 3\nextends = 1\n");  // not top level: an unknown key
  std::string msg = error_of([&] { load_config(a); });
  EXPECT_THAT(msg, HasSubstr("unknown key 'training.extends'"));

  write("c.toml", "# c\nextends = \"a.toml\"\n");
  msg = error_of([&] { load_config(a); });
  EXPECT_THAT(
      msg, HasSubstr("extends cycle: " + a.string() + " -> " + (dir_ / "b.toml").string() + " -> " +
                     (dir_ / "c.toml").string() + " -> " + (dir_ / "a.toml").string()));
  EXPECT_THAT(msg, HasSubstr("extended at " + at("c.toml", 2)));

  const fs::path self = write("self.toml", "extends = \"./self.toml\"\n");
  EXPECT_THAT(error_of([&] { load_config(self); }), HasSubstr("extends cycle"));
}

TEST_F(ConfigTest, ExtendsErrors) {
  const fs::path missing = write("m.toml", "\nextends = \"nope/base.toml\"\n");
  std::string msg = error_of([&] { load_config(missing); });
  EXPECT_THAT(msg, HasSubstr("config file '" + (dir_ / "nope/base.toml").string() + "' not found"));
  EXPECT_THAT(msg, HasSubstr("extended at " + at("m.toml", 2)));

  const fs::path not_string = write("n.toml", "extends = 3\n");
  msg = error_of([&] { load_config(not_string); });
  EXPECT_THAT(msg, HasSubstr("extends: expected a string"));
  EXPECT_THAT(msg, HasSubstr("got integer 3 at " + at("n.toml", 1)));

  // An error inside a base names the base file.
  write("base.toml", "[training]\nsteps = \"x\"\n");
  const fs::path child = write("child.toml", "extends = \"base.toml\"\n");
  EXPECT_THAT(error_of([&] { load_config(child); }), HasSubstr(at("base.toml", 2)));
}

// Huge numbers used to overflow the clock (timeout 18446744073709552 s became 0.384 s and killed
// a healthy job): the key, the value and the allowed range in one message.
TEST_F(ConfigTest, CommTimeoutOutOfRangeNamesTheKeyAndRange) {
  for (const std::string v : {"18446744073709552", "9223372036854776", "0"}) {
    EXPECT_THAT(error_of([&] { load_args({"--comm.timeout_seconds=" + v}); }),
                HasSubstr("comm.timeout_seconds: must be in [1, 3.1536e+07], got " + v));
  }
}

// TOML is UTF-8 without control characters: anything else is refused before toml11 parses it
// (a literal string with the byte 0xE1 made toml11 read past its buffer: config_fuzz_test).
TEST_F(ConfigTest, InvalidUtf8AndControlCharactersAreRefusedWithTheLine) {
  const fs::path bad = write("bad.toml", "[job]\ndump_folder = 'liter\xe1l\\path'\n");
  EXPECT_THAT(error_of([&] { load_config(bad); }),
              HasSubstr("malformed TOML in " + bad.string() + ": byte 0xE1 at line 2 is not UTF-8"));
  const fs::path nul = write("nul.toml", std::string("[job]\n# a \0 here\n", 15));
  EXPECT_THAT(error_of([&] { load_config(nul); }), HasSubstr("control character 0x00 at line 2"));
  EXPECT_THAT(error_of([&] { load_args({"--job.description=\"a\xe1\""}); }),
              HasSubstr("job.description"));
  const fs::path fine = write("fine.toml", "[job]\ndescription = \"caf\xc3\xa9 \xf0\x9f\x98\x80\"\n");
  EXPECT_EQ(load_config(fine).job.description, "caf\xc3\xa9 \xf0\x9f\x98\x80");
}

// Arrays or inline tables nested 10,000 deep used to overflow toml11's recursive parser (exit
// 139): they are refused before parsing, in files and on the command line.
TEST_F(ConfigTest, DeeplyNestedValuesAreErrorsNotStackOverflows) {
  const std::string arrays = std::string(10000, '[') + std::string(10000, ']');
  std::string tables;
  for (int i = 0; i < 10000; ++i) tables += "{a = ";
  tables += "1" + std::string(10000, '}');
  for (const std::string& value : {arrays, tables}) {
    const fs::path file = write("deep.toml", "[training]\nsteps = " + value + "\n");
    EXPECT_THAT(error_of([&] { load_config(file); }),
                HasSubstr("nested 10000 deep (at most 64)"));
    EXPECT_THAT(error_of([&] { load_args({"--training.steps=" + value}); }),
                HasSubstr("training.steps"));
  }
  // Brackets inside strings and comments are not nesting.
  const fs::path quoted = write("quoted.toml", "[job]\ndescription = \"" +
                                                   std::string(100, '[') + "\" # " +
                                                   std::string(100, '{') + "\n");
  EXPECT_EQ(load_config(quoted).job.description, std::string(100, '['));
}

// ---------------------------------------------------------------------------------------------
// Errors: unknown names, types, values, combinations, malformed files, command line

TEST_F(ConfigTest, UnknownKeySuggestsTheNearest) {
  const fs::path file = write("x.toml", "[training]\nsteps = 3\nstpes = 10\n");
  EXPECT_EQ(
      error_of([&] { load_config(file); }),
      "unknown key 'training.stpes' at " + at("x.toml", 3) + "; did you mean 'training.steps'?");

  // A key of another section is found there.
  const fs::path moved = write("y.toml", "[training]\nlr = 0.1\n");
  EXPECT_EQ(error_of([&] { load_config(moved); }),
            "unknown key 'training.lr' at " + at("y.toml", 2) + "; did you mean 'optimizer.lr'?");

  // Nothing near: the valid keys are listed.
  const fs::path far = write("z.toml", "[comm]\nzzzzzzzz = 1\n");
  EXPECT_THAT(error_of([&] { load_config(far); }),
              HasSubstr("valid keys of [comm]: timeout_seconds"));
}

TEST_F(ConfigTest, UnknownSectionSuggestsTheNearest) {
  const fs::path file = write("x.toml", "# a comment\n\n[trainig]\nsteps = 10\n");
  EXPECT_EQ(error_of([&] { load_config(file); }),
            "unknown section [trainig] at " + at("x.toml", 3) + "; did you mean [training]?");

  const fs::path far = write("y.toml", "[zzzzzzzz]\n");
  EXPECT_THAT(error_of([&] { load_config(far); }),
              HasSubstr("valid sections: [job], [model], [optimizer]"));

  const fs::path top = write("z.toml", "steps = 10\n");
  std::string msg = error_of([&] { load_config(top); });
  EXPECT_THAT(msg, HasSubstr("unknown top-level key 'steps' at " + at("z.toml", 1)));
  EXPECT_THAT(msg, HasSubstr("did you mean 'training.steps'?"));

  const fs::path scalar = write("w.toml", "\ntraining = 3\n");
  EXPECT_EQ(
      error_of([&] { load_config(scalar); }),
      "training: expected a table (a [training] section), got integer 3 at " + at("w.toml", 2));
}

TEST_F(ConfigTest, WrongTypesNameKeyValueFileAndLine) {
  std::string text;
  for (int i = 1; i <= 10; ++i) text += "# line " + std::to_string(i) + "\n";
  text += "[training]\nsteps = \"ten\"\n";  // line 12
  const fs::path file = write("x.toml", text);
  EXPECT_EQ(error_of([&] { load_config(file); }),
            "training.steps: expected an integer, got string \"ten\" at " + at("x.toml", 12));

  const struct {
    std::string toml, message;
  } cases[] = {
      {"[training]\nseq_len = 10.5\n", "training.seq_len: expected an integer, got float 10.5"},
      {"[training]\ndeterministic = \"yes\"\n",
       "training.deterministic: expected a boolean (true or false), got string \"yes\""},
      {"[optimizer]\nlr = \"fast\"\n", "optimizer.lr: expected a number, got string \"fast\""},
      {"[optimizer]\nlr = inf\n", "optimizer.lr: expected a finite number, got float inf"},
      {"[model]\nname = 3\n", "model.name: expected a string, got integer 3"},
      {"[checkpoint]\nexclude_from_loading = \"optimizer\"\n",
       "checkpoint.exclude_from_loading: expected a list of strings, got string \"optimizer\""},
      {"[checkpoint]\nexclude_from_loading = [\"a\", 2]\n",
       "checkpoint.exclude_from_loading: expected a list of strings, got integer 2 as item 2"},
  };
  for (const auto& c : cases) {
    const fs::path f = write("case.toml", c.toml);
    EXPECT_EQ(error_of([&] { load_config(f); }), c.message + " at " + at("case.toml", 2));
  }
}

TEST_F(ConfigTest, InvalidValuesNameTheRule) {
  const struct {
    std::string toml, message;
  } cases[] = {
      {"[training]\nsteps = -5\n", "training.steps: must be > 0, got -5"},
      {"[training]\nseq_len = 0\n", "training.seq_len: must be > 0, got 0"},
      {"[optimizer]\nlr = 0\n", "optimizer.lr: must be > 0, got 0.0"},
      {"[embedding]\nmemory_budget_mb = 17592186044417\n",  // its bytes would overflow
       "embedding.memory_budget_mb: must be > 0 and at most 2^40 (MiB), got 17592186044417"},
      {"[optimizer]\nbeta2 = 1.0\n", "optimizer.beta2: must be in [0, 1), got 1.0"},
      {"[training]\nglobal_batch_size = 0\n", "training.global_batch_size: must be > 0, or -1"},
      {"[lr_scheduler]\ndecay_type = \"cosin\"\n",
       "lr_scheduler.decay_type: must be one of \"linear\", \"sqrt\", \"cosine\", got \"cosin\""},
      {"[activation_checkpoint]\nselective_ac_option = \"0\"\n",
       "activation_checkpoint.selective_ac_option: must be a positive integer as a string, or "
       "\"op\", got \"0\""},
      {"[activation_checkpoint]\nselective_ac_option = \"ops\"\n",
       "activation_checkpoint.selective_ac_option: must be a positive integer as a string, or "
       "\"op\", got \"ops\""},
      {"[job]\ndump_folder = \"\"\n", "job.dump_folder: must be non-empty"},
      {"[metrics]\nsave_tb_folder = \"\"\n", "metrics.save_tb_folder: must be non-empty"},
  };
  for (const auto& c : cases) {
    const fs::path f = write("case.toml", c.toml);
    const std::string msg = error_of([&] { load_config(f); });
    EXPECT_THAT(msg, HasSubstr(c.message));
    EXPECT_THAT(msg, HasSubstr(" at " + at("case.toml", 2)));
  }
  // A near name is suggested for a value of a fixed set.
  const fs::path f = write("d.toml", "[lr_scheduler]\ndecay_type = \"cosin\"\n");
  EXPECT_THAT(error_of([&] { load_config(f); }), HasSubstr("; did you mean \"cosine\"?"));
  // Values set on the command line name the flag.
  EXPECT_EQ(error_of([&] { load_args({"--training.steps=-3"}); }),
            "training.steps: must be > 0, got -3 at command-line flag --training.steps=-3");
}

TEST_F(ConfigTest, InvalidCombinationsNameEveryKey) {
  const fs::path batch = write("b.toml", "[training]\nglobal_batch_size = 12\n");
  EXPECT_EQ(error_of([&] { load_config(batch); }),
            "invalid config: training.global_batch_size must be a multiple of "
            "training.local_batch_size; got training.global_batch_size = 12 (" +
                at("b.toml", 2) + "), training.local_batch_size = 8 (default value)");

  const fs::path ckpt = write("c.toml", "[checkpoint]\nenable = true\ninterval = 0\n");
  std::string msg = error_of([&] { load_config(ckpt); });
  EXPECT_THAT(msg, HasSubstr("checkpoint.interval must be > 0 when checkpoint.enable = true"));
  EXPECT_THAT(msg, HasSubstr("checkpoint.interval = 0 (" + at("c.toml", 3) + ")"));
  // Disabled, the interval does not matter.
  EXPECT_NO_THROW(load_config(ckpt, {"--checkpoint.enable=false"}));

  EXPECT_THAT(error_of([&] {
                load_args({"--validation.enable=true", "--validation.freq=0"});
              }),
              HasSubstr("validation.freq must be > 0 when validation.enable = true"));
  EXPECT_THAT(error_of([&] {
                load_args({"--profiling.enable=true", "--profiling.profile_freq=0"});
              }),
              HasSubstr("profiling.profile_freq must be > 0 when profiling.enable = true"));
  // An execution trace records the profiled steps: without profiling there are none.
  EXPECT_THAT(error_of([&] { load_args({"--profiling.execution_trace=true"}); }),
              HasSubstr("profiling.execution_trace records the profiled steps"));
  EXPECT_NO_THROW(load_args({"--profiling.execution_trace=true", "--profiling.enable=true"}));
  EXPECT_NO_THROW(load_args({"--comm.trace=true"}));
}

// A quick run of a config whose warmup is longer than the run: the warmup is clamped to the
// steps with one warning line (torchtitan does the same), not an error.
TEST_F(ConfigTest, WarmupLongerThanTheRunIsClampedWithAWarning) {
  const fs::path file = write("w.toml", "[lr_scheduler]\nwarmup_steps = 20\n");
  JobConfig c;
  ASSERT_NO_THROW(c = load_config(file, {"--training.steps=4"}));
  EXPECT_NO_THROW(validate_for_world(c, 1));
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 20);  // the config keeps what the user wrote

  runtime::Tensor w = runtime::zeros({2});
  w.set_requires_grad(true);
  auto optimizer = make_optimizer(c.optimizer, {{"w", w}});
  std::ostringstream log;
  auto scheduler = make_lr_scheduler(c.lr_scheduler, *optimizer, c.training.steps, &log);
  EXPECT_EQ(log.str(),
            "warning: [lr_scheduler] warmup_steps = 20 exceeds [training] steps = 4: warming up "
            "over 4 steps\n");
  EXPECT_EQ(scheduler->phases().warmup, 4);
  EXPECT_EQ(scheduler->phases().decay, 0);
  EXPECT_DOUBLE_EQ(scheduler->factor(0), 1.0 / 4.0);  // (s + 1) / W over 4 steps
  EXPECT_EQ(scheduler->factor(3), 1.0);

  // A warmup within the run says nothing; a negative one is still an error.
  std::ostringstream quiet;
  make_lr_scheduler(c.lr_scheduler, *optimizer, 20, &quiet);
  EXPECT_EQ(quiet.str(), "");
  EXPECT_THAT(error_of([&] { load_config(file, {"--lr_scheduler.warmup_steps=-1"}); }),
              HasSubstr("lr_scheduler.warmup_steps: must be >= 0, got -1"));
}

TEST_F(ConfigTest, ValidateForWorld) {
  JobConfig c = load_args({"--training.local_batch_size=4", "--training.global_batch_size=32"});
  WorldLayout w = validate_for_world(c, 4);
  EXPECT_EQ(w.dp_replicate, 1);
  EXPECT_EQ(w.dp_shard, 4);
  EXPECT_EQ(w.dp, 4);
  EXPECT_EQ(w.ep, 1);
  EXPECT_EQ(w.global_batch_size, 32);
  EXPECT_EQ(w.grad_accum_steps, 2);
  w = validate_for_world(c, 1);
  EXPECT_EQ(w.grad_accum_steps, 8);

  // -1: one local batch per data-parallel rank, no accumulation.
  w = validate_for_world(load_args({"--training.local_batch_size=4",
                                    "--parallelism.data_parallel_replicate_degree=2"}),
                         4);
  EXPECT_EQ(w.dp_replicate, 2);
  EXPECT_EQ(w.dp_shard, 2);
  EXPECT_EQ(w.global_batch_size, 16);
  EXPECT_EQ(w.grad_accum_steps, 1);

  c = load_args({"--training.local_batch_size=4", "--training.global_batch_size=24"});
  EXPECT_NO_THROW(validate_for_world(c, 2));
  std::string msg = error_of([&] { validate_for_world(c, 4); });
  EXPECT_THAT(msg, HasSubstr("training.global_batch_size must be a multiple of local_batch_size "
                             "x data-parallel degree = 4 x 4 = 16 on the world size 4"));
  EXPECT_THAT(msg, HasSubstr("training.global_batch_size = 24 (command-line flag "
                             "--training.global_batch_size=24)"));

  c = load_args({"--parallelism.data_parallel_replicate_degree=3"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 4); }),
              HasSubstr("data_parallel_replicate_degree x context_parallel_degree x "
                        "tensor_parallel_degree must divide the world size 4"));
  c = load_args({"--parallelism.data_parallel_replicate_degree=2",
                 "--parallelism.data_parallel_shard_degree=3"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 4); }),
              HasSubstr("data_parallel_replicate_degree x data_parallel_shard_degree x "
                        "context_parallel_degree x tensor_parallel_degree must equal the world "
                        "size 4"));
  // Tensor parallelism takes its ranks first; dp_shard = -1 gets the rest.
  const WorldLayout tp = validate_for_world(load_args({"--parallelism.tensor_parallel_degree=2"}), 4);
  EXPECT_EQ(tp.tp, 2);
  EXPECT_EQ(tp.dp_shard, 2);
  EXPECT_EQ(tp.dp, 2);
  c = load_args({"--parallelism.tensor_parallel_degree=2", "--training.seq_len=33"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 4); }),
              HasSubstr("training.seq_len must be a multiple of tensor_parallel_degree"));
  c = load_args({"--parallelism.tensor_parallel_degree=3"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 4); }),
              HasSubstr("tensor_parallel_degree = 3 (command-line flag"));
  c = load_args({"--parallelism.expert_parallel_degree=3"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 4); }),
              HasSubstr("parallelism.expert_parallel_degree must divide "
                        "data_parallel_shard_degree x context_parallel_degree (4 on the world "
                        "size 4)"));
  EXPECT_EQ(validate_for_world(load_args({"--parallelism.expert_parallel_degree=2"}), 4).ep, 2);
  EXPECT_THROW(validate_for_world(JobConfig{}, 0), mt::Error);
}

// [parallelism] context_parallel_degree: cp ranks share their batches (not data-parallel), split
// each sequence into 2 cp chunks, and lend their ranks to expert parallelism.
TEST_F(ConfigTest, ContextParallelDegree) {
  const WorldLayout cp = validate_for_world(
      load_args({"--parallelism.context_parallel_degree=2", "--training.local_batch_size=4",
                 "--training.seq_len=64"}),
      8);
  EXPECT_EQ(cp.cp, 2);
  EXPECT_EQ(cp.dp_shard, 4);
  EXPECT_EQ(cp.dp, 4);
  EXPECT_EQ(cp.global_batch_size, 16);  // the data-parallel ranks' batches only
  EXPECT_EQ(validate_for_world(load_args({"--parallelism.context_parallel_degree=2",
                                          "--parallelism.expert_parallel_degree=4",
                                          "--training.seq_len=64"}),
                               4)
                .ep,
            4);  // ep over dp_shard 2 x cp 2
  auto c = load_args({"--parallelism.context_parallel_degree=3", "--training.seq_len=66"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 4); }),
              HasSubstr("context_parallel_degree x tensor_parallel_degree must divide the world "
                        "size 4"));
  c = load_args({"--parallelism.context_parallel_degree=4", "--training.seq_len=36"});
  std::string msg = error_of([&] { validate_for_world(c, 4); });
  EXPECT_THAT(msg, HasSubstr("training.seq_len must be a multiple of 2 x context_parallel_degree"));
  EXPECT_THAT(msg, HasSubstr("training.seq_len = 36 (command-line flag"));
  c = load_args({"--parallelism.context_parallel_degree=2",
                 "--parallelism.tensor_parallel_degree=4", "--training.seq_len=36"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 8); }),
              HasSubstr("training.seq_len / context_parallel_degree must be a multiple of "
                        "tensor_parallel_degree"));
  EXPECT_NO_THROW(validate_for_world(load_args({"--parallelism.context_parallel_degree=2",
                                                "--parallelism.context_parallel_rotate_method="
                                                "alltoall"}),
                                     2));
  EXPECT_THAT(error_of([&] { load_args({"--parallelism.context_parallel_rotate_method=ring"}); }),
              HasSubstr("parallelism.context_parallel_rotate_method: must be"));
  EXPECT_THAT(error_of([&] { load_args({"--parallelism.context_parallel_degree=0"}); }),
              HasSubstr("parallelism.context_parallel_degree: must be > 0, got 0"));
}

// [parallelism] pipeline_parallel_*: pp is the outermost degree; micro-batches split the local
// batch; what cannot run without the model is an error naming the keys.
TEST_F(ConfigTest, PipelineDegreesAndMicroBatches) {
  const WorldLayout pp = validate_for_world(
      load_args({"--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=8",
                 "--parallelism.pipeline_parallel_microbatch_size=2"}),
      8);
  EXPECT_EQ(pp.pp, 2);
  EXPECT_EQ(pp.dp_shard, 4);
  EXPECT_EQ(pp.dp, 4);
  EXPECT_EQ(pp.microbatches, 4);
  EXPECT_EQ(pp.global_batch_size, 32);  // the data-parallel ranks' batches only
  EXPECT_EQ(validate_for_world(load_args({"--training.local_batch_size=8"}), 1).microbatches, 1);
  auto c = load_args({"--parallelism.pipeline_parallel_degree=3"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 4); }),
              HasSubstr("pipeline_parallel_degree x data_parallel_replicate_degree x "
                        "context_parallel_degree x tensor_parallel_degree must divide the world "
                        "size 4"));
  c = load_args({"--parallelism.pipeline_parallel_degree=2", "--training.local_batch_size=8",
                 "--parallelism.pipeline_parallel_microbatch_size=3"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 2); }),
              HasSubstr("training.local_batch_size must be a multiple of "
                        "parallelism.pipeline_parallel_microbatch_size"));
  c = load_args({"--parallelism.pipeline_parallel_degree=2",
                 "--parallelism.pipeline_parallel_layers_per_stage=2",
                 "--parallelism.pipeline_parallel_split_points=layers.2"});
  EXPECT_THAT(error_of([&] { validate_for_world(c, 2); }),
              HasSubstr("give either parallelism.pipeline_parallel_layers_per_stage or "
                        "parallelism.pipeline_parallel_split_points, not both"));
  EXPECT_THAT(error_of([&] {
                load_args({"--parallelism.pipeline_parallel_schedule=1F1b_typo"});
              }),
              HasSubstr("pipeline_parallel_schedule"));
}

TEST_F(ConfigTest, MalformedTomlNamesFileAndLine) {
  const fs::path file = write("x.toml", "[training]\nsteps = 3\nseq_len = = 4\n");
  const std::string msg = error_of([&] { load_config(file); });
  EXPECT_THAT(msg, HasSubstr("malformed TOML in " + at("x.toml", 3) + ": "));
  EXPECT_THAT(msg, HasSubstr("seq_len = = 4"));  // toml11's excerpt of the line

  const fs::path duplicate = write("d.toml", "[training]\nsteps = 3\nsteps = 4\n");
  EXPECT_THAT(error_of([&] { load_config(duplicate); }), HasSubstr("malformed TOML in "));

  EXPECT_EQ(error_of([&] { load_config(dir_ / "absent.toml"); }),
            "config file '" + (dir_ / "absent.toml").string() + "' not found");
  EXPECT_EQ(error_of([&] { load_config(dir_); }),
            "config file '" + dir_.string() + "' is a folder");
}

TEST_F(ConfigTest, CommandLineErrors) {
  EXPECT_EQ(error_of([&] { parse_command_line({"--config", "a.toml", "--config=b.toml"}); }),
            "--config given twice (a.toml and b.toml): give one file; it may `extends` another");
  EXPECT_EQ(error_of([&] { parse_command_line({"--training.stpes=5"}); }),
            "unknown command-line flag --training.stpes=5; did you mean --training.steps?");
  EXPECT_EQ(error_of([&] {
              parse_command_line({"--traning.steps", "5"});
            }),
            "unknown command-line flag --traning.steps; did you mean --training.steps?");
  EXPECT_EQ(error_of([&] { parse_command_line({"--training.lr=1"}); }),
            "unknown command-line flag --training.lr=1; did you mean --optimizer.lr?");
  EXPECT_EQ(error_of([&] {
              parse_command_line({"--confg", "x.toml"});
            }),
            "unknown command-line flag --confg; did you mean --config?");
  EXPECT_THAT(error_of([&] { parse_command_line({"--zzzzzzzzzzzz"}); }),
              HasSubstr("see --help for every key"));

  EXPECT_EQ(error_of([&] { parse_command_line({"--training.steps"}); }),
            "missing value after --training.steps (write --training.steps=VALUE or "
            "--training.steps VALUE)");
  EXPECT_THAT(error_of([&] {
                parse_command_line({"--training.steps", "--optimizer.lr=1"});
              }),
              HasSubstr("missing value after --training.steps"));
  EXPECT_THAT(error_of([&] { parse_command_line({"--config"}); }),
              HasSubstr("missing value after --config"));
  EXPECT_THAT(error_of([&] { parse_command_line({"--print-config=yes"}); }),
              HasSubstr("--print-config takes no value"));
  EXPECT_THAT(error_of([&] { parse_command_line({"configs/x.toml"}); }),
              HasSubstr("unexpected command-line argument 'configs/x.toml'"));

  EXPECT_EQ(error_of([&] { parse_command_line({"--training.steps=ten"}); }),
            "training.steps: expected an integer, got \"ten\" at command-line flag "
            "--training.steps=ten");
  EXPECT_EQ(error_of([&] {
              parse_command_line({"--checkpoint.enable", "yes"});
            }),
            "checkpoint.enable: expected a boolean (true or false), got \"yes\" at command-line "
            "flag --checkpoint.enable yes");
  EXPECT_THAT(error_of([&] { parse_command_line({"--optimizer.lr=1e-3x"}); }),
              HasSubstr("optimizer.lr: expected a finite number, got \"1e-3x\""));
  EXPECT_THAT(error_of([&] { parse_command_line({"--optimizer.lr=nan"}); }),
              HasSubstr("expected a finite number"));
  EXPECT_THAT(error_of([&] { parse_command_line({"--training.steps=99999999999999999999"}); }),
              HasSubstr("out of the 64-bit range"));
  EXPECT_THAT(error_of([&] { parse_command_line({"--checkpoint.exclude_from_loading=a,,b"}); }),
              HasSubstr("empty item"));
  EXPECT_THAT(error_of([&] { parse_command_line({"--checkpoint.exclude_from_loading=[1]"}); }),
              HasSubstr("expected a list of strings, got integer 1 as item 1"));
}

// ---------------------------------------------------------------------------------------------
// Dotted sections: [quantize.linear.float8]

TEST_F(ConfigTest, Float8SectionIsANestedTomlTable) {
  const fs::path file = write("x.toml",
                              "[training]\n"
                              "device = \"cpu\"\n"
                              "\n"
                              "[quantize.linear.float8]\n"
                              "enable = true\n"
                              "filter_fqns = [\"output\", \"router\"]\n"
                              "emulate = true\n");
  const JobConfig c = load_config(file);
  EXPECT_TRUE(c.float8.enable);
  EXPECT_EQ(c.float8.recipe_name, "tensorwise");
  EXPECT_EQ(c.float8.filter_fqns, (StringList{"output", "router"}));
  EXPECT_TRUE(c.float8.emulate);
  EXPECT_EQ(c.where("quantize.linear.float8.enable"), at("x.toml", 5));
  EXPECT_EQ(c.where("quantize.linear.float8.emulate"), at("x.toml", 7));
  EXPECT_EQ(c.where("quantize.linear.float8.recipe_name"), "default value");

  // The other ways TOML writes the same nested tables.
  for (const std::string& text :
       {std::string("[quantize]\nlinear.float8.enable = true\nlinear.float8.emulate = true\n"),
        std::string("[quantize.linear]\nfloat8 = { enable = true, emulate = true }\n"),
        std::string("quantize.linear.float8.enable = true\n"
                    "quantize.linear.float8.emulate = true\n")}) {
    SCOPED_TRACE(text);
    const JobConfig d = load_config(write("y.toml", text + "[training]\ndevice = \"cuda\"\n"));
    EXPECT_TRUE(d.float8.enable);
    EXPECT_TRUE(d.float8.emulate);
    EXPECT_EQ(d.float8.filter_fqns, StringList{"output"});
  }
}

TEST_F(ConfigTest, Float8SectionOnTheCommandLine) {
  const fs::path file = write("x.toml", "[quantize.linear.float8]\nenable = false\n");
  const JobConfig c = load_config(
      file, {"--quantize.linear.float8.enable=true", "--quantize.linear.float8.emulate", "true",
             "--quantize.linear.float8.filter_fqns=output,layers.0", "--training.device=cpu"});
  EXPECT_TRUE(c.float8.enable);
  EXPECT_TRUE(c.float8.emulate);
  EXPECT_EQ(c.float8.filter_fqns, (StringList{"output", "layers.0"}));
  EXPECT_EQ(c.where("quantize.linear.float8.enable"),
            "command-line flag --quantize.linear.float8.enable=true");
  // An empty list: every linear float8.
  EXPECT_TRUE(load_args({"--quantize.linear.float8.filter_fqns="}).float8.filter_fqns.empty());
  EXPECT_THAT(help_text(), HasSubstr("\n[quantize.linear.float8]  Float8 training"));
  EXPECT_THAT(help_text(), HasSubstr("--quantize.linear.float8.filter_fqns=LIST  (default "
                                     "[\"output\"])"));
}

// [quantize.grouped_mm.float8] sits beside [quantize.linear.float8] in the same [quantize] table;
// on the CPU it needs its own emulate, and tensor parallelism is refused, each naming the keys.
TEST_F(ConfigTest, Float8GroupedMmSection) {
  const fs::path file = write("g.toml",
                              "[training]\ndevice = \"cpu\"\n\n"
                              "[quantize.linear.float8]\nenable = false\n\n"
                              "[quantize.grouped_mm.float8]\nfqns = [\"experts\"]\nemulate = true\n");
  const JobConfig c = load_config(file);
  EXPECT_EQ(c.float8_grouped_mm.fqns, StringList{"experts"});
  EXPECT_TRUE(c.float8_grouped_mm.emulate);
  EXPECT_FALSE(c.float8.enable);
  EXPECT_EQ(c.where("quantize.grouped_mm.float8.fqns"), at("g.toml", 8));
  EXPECT_TRUE(load_args({}).float8_grouped_mm.fqns.empty());  // off by default
  EXPECT_THAT(error_of([&] {
                load_args({"--quantize.grouped_mm.float8.fqns=experts", "--training.device=cpu"});
              }),
              HasSubstr("set quantize.grouped_mm.float8.emulate = true"));
  // Float8 experts compose with tensor parallelism (moe_trainer_mpi_test checks the training).
  EXPECT_EQ(load_args({"--quantize.grouped_mm.float8.fqns=experts",
                       "--parallelism.tensor_parallel_degree=2"})
                .parallelism.tensor_parallel_degree,
            2);
  EXPECT_THAT(help_text(), HasSubstr("\n[quantize.grouped_mm.float8]  Float8 grouped GEMMs"));
}

TEST_F(ConfigTest, UnknownNamesInDottedSectionsSuggestTheNearest) {
  const struct {
    std::string toml, message;
  } cases[] = {
      {"\n[quantize.linear.float9]\nenable = true\n",
       "unknown section [quantize.linear.float9] at LINE2; did you mean "
       "[quantize.linear.float8]?"},
      {"\n[quantise.linear.float8]\nenable = true\n",
       "unknown section [quantise.linear.float8] at LINE2; did you mean "
       "[quantize.linear.float8]?"},
      {"[quantize.linear.float8]\nenabel = true\n",
       "unknown key 'quantize.linear.float8.enabel' at LINE2; did you mean "
       "'quantize.linear.float8.enable'?"},
      {"[quantize]\nenable = true\n",
       "unknown key 'quantize.enable' at LINE2; [quantize] holds only the sections "
       "[quantize.linear.float8], [quantize.grouped_mm.float8]: did you mean "
       "'quantize.linear.float8.enable'?"},
      {"[quantize.linear]\nzzzzzzzz = 1\n",
       "unknown key 'quantize.linear.zzzzzzzz' at LINE2; [quantize.linear] holds only the "
       "sections [quantize.linear.float8]"},
      {"[quantize]\nlinear = 1\n",
       "quantize.linear: expected a table (holding the sections [quantize.linear.float8]), got "
       "integer 1 at LINE2"},
      {"\nquantize = 1\n",
       "quantize: expected a table (holding the sections [quantize.linear.float8], "
       "[quantize.grouped_mm.float8]), got integer 1 at LINE2"},
      {"[quantize.linear]\nfloat8 = 1\n",
       "quantize.linear.float8: expected a table (a [quantize.linear.float8] section), got "
       "integer 1 at LINE2"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.toml);
    const fs::path f = write("case.toml", c.toml);
    std::string message = c.message;
    message.replace(message.find("LINE2"), 5, at("case.toml", 2));
    EXPECT_EQ(error_of([&] { load_config(f); }), message);
  }
  EXPECT_EQ(error_of([&] { parse_command_line({"--quantize.linear.float8.enabel=true"}); }),
            "unknown command-line flag --quantize.linear.float8.enabel=true; did you mean "
            "--quantize.linear.float8.enable?");
  EXPECT_EQ(error_of([&] { parse_command_line({"--quantize.enable=true"}); }),
            "unknown command-line flag --quantize.enable=true; did you mean "
            "--quantize.linear.float8.enable?");
  EXPECT_EQ(error_of([&] { parse_command_line({"--quantize.linear.flaot8.enable=true"}); }),
            "unknown command-line flag --quantize.linear.flaot8.enable=true; did you mean "
            "--quantize.linear.float8.enable?");
}

TEST_F(ConfigTest, Float8RecipesAndTheirRules) {
  const fs::path file = write("x.toml", "[quantize.linear.float8]\nrecipe_name = \"rowwise\"\n");
  EXPECT_EQ(load_config(file).float8.recipe_name, "rowwise");
  EXPECT_THAT(error_of([&] { load_args({"--quantize.linear.float8.recipe_name=tensorwis"}); }),
              HasSubstr("got \"tensorwis\" at command-line flag "
                        "--quantize.linear.float8.recipe_name=tensorwis; did you mean "
                        "\"tensorwise\"?"));
  // FSDP's float8 all-gather gathers tensorwise codes only.
  EXPECT_THAT(error_of([&] {
                load_args({"--quantize.linear.float8.enable=true",
                           "--quantize.linear.float8.recipe_name=rowwise",
                           "--quantize.linear.float8.enable_fsdp_float8_all_gather=true"});
              }),
              HasSubstr("the rowwise recipe scales each weight per output feature"));
}

// The float8 all-gather needs float8 training; precomputing its scales needs the all-gather.
TEST_F(ConfigTest, Float8AllGatherKeysNeedWhatTheyBuildOn) {
  EXPECT_THAT(
      error_of([&] { load_args({"--quantize.linear.float8.enable_fsdp_float8_all_gather=true"}); }),
      HasSubstr("enable_fsdp_float8_all_gather needs float8 training"));
  EXPECT_THAT(error_of([&] {
                load_args({"--quantize.linear.float8.enable=true", "--training.device=cuda",
                           "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp="
                           "true"});
              }),
              HasSubstr("precompute_float8_dynamic_scale_for_fsdp needs "
                        "quantize.linear.float8.enable_fsdp_float8_all_gather = true"));
  const JobConfig c = load_args(
      {"--quantize.linear.float8.enable=true", "--training.device=cuda",
       "--quantize.linear.float8.enable_fsdp_float8_all_gather=true",
       "--quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp=true"});
  EXPECT_TRUE(c.float8.enable_fsdp_float8_all_gather);
  EXPECT_TRUE(c.float8.precompute_float8_dynamic_scale_for_fsdp);
}

TEST_F(ConfigTest, Float8OnTheCpuNeedsEmulate) {
  const fs::path file = write("x.toml",
                              "[training]\ndevice = \"cpu\"\n"
                              "[quantize.linear.float8]\nenable = true\n");
  EXPECT_EQ(error_of([&] { load_config(file); }),
            "invalid config: float8 training on the CPU: the CPU has no FP8 GEMMs (float8 "
            "training needs a GPU with FP8 tensor cores); set quantize.linear.float8.emulate = "
            "true to run the exact CPU reference (for tests and debugging); got "
            "quantize.linear.float8.enable = true (" +
                at("x.toml", 4) + "), training.device = \"cpu\" (" + at("x.toml", 2) +
                "), quantize.linear.float8.emulate = false (default value)");
  EXPECT_NO_THROW(load_config(file, {"--quantize.linear.float8.emulate=true"}));
  EXPECT_NO_THROW(load_config(file, {"--quantize.linear.float8.enable=false"}));
  // "auto" is known only at run time: the trainer checks it once resolved.
  EXPECT_NO_THROW(load_config(file, {"--training.device=auto"}));
  EXPECT_NO_THROW(load_config(file, {"--training.device=cuda"}));
  // Tensor parallelism with float8: either recipe; tensorwise with or without FSDP's float8
  // all-gather.
  EXPECT_NO_THROW(
      load_config(file, {"--training.device=cuda", "--parallelism.tensor_parallel_degree=2"}));
  EXPECT_NO_THROW(load_config(file, {"--training.device=cuda",
                                     "--parallelism.tensor_parallel_degree=2",
                                     "--quantize.linear.float8.enable_fsdp_float8_all_gather=true"}));
  EXPECT_NO_THROW(load_config(file, {"--training.device=cuda",
                                     "--parallelism.tensor_parallel_degree=2",
                                     "--quantize.linear.float8.recipe_name=rowwise"}));
}

TEST_F(ConfigTest, Float8SectionRoundTripsThroughPrintConfig) {
  const JobConfig c = load_args(
      {"--quantize.linear.float8.enable=true", "--quantize.linear.float8.emulate=true",
       "--quantize.linear.float8.filter_fqns=output,router.gate", "--training.device=cpu"});
  const std::string text = render_toml(c);
  EXPECT_THAT(text, HasSubstr("\n[quantize.linear.float8]  # Float8 training"));
  EXPECT_THAT(text, HasSubstr("\nfilter_fqns = [\"output\", \"router.gate\"]  # from "
                              "command-line flag --quantize.linear.float8.filter_fqns="));
  const fs::path out = dir_ / "config.toml";
  write_config(c, out);
  const JobConfig back = load_config(out);
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.float8, c.float8);
  EXPECT_EQ(back.where("quantize.linear.float8.enable").rfind(out.string() + " line ", 0), 0u);
}

// ---------------------------------------------------------------------------------------------
// --print-config

TEST_F(ConfigTest, PrintConfigRoundTrips) {
  const fs::path file = write("x.toml",
                              "[job]\n"
                              "description = \"tricky \\\"quotes\\\", back\\\\slash, tab\\t, "
                              "newline\\n, unicode é ✓\"\n"
                              "[optimizer]\n"
                              "lr = 1e-8\n"
                              "weight_decay = 0.1\n"
                              "beta2 = 0.999\n"
                              "[lr_scheduler]\n"
                              "min_lr_factor = 0.3333333333333333\n"
                              "[training]\n"
                              "max_norm = 1e300\n"
                              "seed = 1234567890123\n");
  const JobConfig c = load_config(file, {"--checkpoint.exclude_from_loading=a b,[c]",
                                         "--checkpoint.enable=true", "--optimizer.lr=0.1"});
  const std::string text = render_toml(c);
  for (const SectionSpec& s : schema()) {
    EXPECT_THAT(text, HasSubstr(std::string("\n[").append(s.name).append("]")));
    for (const FieldSpec& f : s.fields) {
      EXPECT_THAT(
          text,
          HasSubstr(std::string("\n").append(f.name).append(" = ").append(to_toml(f.get(c)))));
    }
  }
  EXPECT_THAT(text, HasSubstr("lr = 0.1  # from command-line flag --optimizer.lr=0.1"));
  EXPECT_THAT(text, HasSubstr("beta2 = 0.999  # from " + at("x.toml", 6)));
  EXPECT_THAT(text, HasSubstr("# Peak learning rate"));

  const fs::path out = dir_ / "dump" / "sub" / "config.toml";
  write_config(c, out);
  std::stringstream written;
  written << std::ifstream(out).rdbuf();
  EXPECT_EQ(written.str(), text);
  EXPECT_FALSE(fs::exists(out.string() + ".tmp"));
  const JobConfig back = load_config(out);
  EXPECT_EQ(back, c);
  EXPECT_EQ(back.job.description, c.job.description);
  EXPECT_EQ(render_toml(back, {.docs = true, .origins = false}),
            render_toml(c, {.docs = true, .origins = false}));

  // Defaults round-trip too, and rendering without docs or origins has only sections and keys.
  write_config(JobConfig{}, out, {.docs = false, .origins = false});
  EXPECT_EQ(load_config(out), JobConfig{});
  const std::string bare = render_toml(JobConfig{}, {.docs = false, .origins = false});
  EXPECT_THAT(bare, Not(HasSubstr("Peak learning rate")));
}

TEST_F(ConfigTest, ValueTextForms) {
  EXPECT_EQ(to_toml(Value{1.0}), "1.0");
  EXPECT_EQ(to_toml(Value{0.25}), "0.25");
  EXPECT_EQ(to_toml(Value{8e-4}), "8e-04");  // shortest form that reads back exactly
  EXPECT_EQ(to_toml(Value{-2.5}), "-2.5");
  EXPECT_EQ(to_toml(Value{int64_t{-3}}), "-3");
  EXPECT_EQ(to_toml(Value{true}), "true");
  EXPECT_EQ(to_toml(Value{std::string("a\"b\\c\x01")}), "\"a\\\"b\\\\c\\u0001\"");
  EXPECT_EQ(to_toml(Value{StringList{"a", "b"}}), "[\"a\", \"b\"]");
  EXPECT_EQ(to_toml(Value{StringList{}}), "[]");
}

TEST_F(ConfigTest, EditDistanceAndNearest) {
  EXPECT_EQ(edit_distance("steps", "steps"), 0u);
  EXPECT_EQ(edit_distance("stpes", "steps"), 1u);  // a swap counts once
  EXPECT_EQ(edit_distance("seqlen", "seq_len"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  const std::vector<std::string> keys = {"steps", "seq_len", "seed"};
  EXPECT_EQ(nearest("step", keys), "steps");
  EXPECT_EQ(nearest("seqlen", keys), "seq_len");
  EXPECT_EQ(nearest("learning_rate", keys), std::nullopt);
  EXPECT_EQ(nearest("x", {"lr"}), std::nullopt);  // a wholesale replacement is no suggestion
}

// ---------------------------------------------------------------------------------------------
// Shipped configs

// configs/ of the source tree: the nearest folder, walking up from the working directory (ctest
// runs in build*/tests), that holds configs/debug_model.toml.
fs::path find_configs_dir() {
  for (fs::path p = fs::current_path();; p = p.parent_path()) {
    if (fs::exists(p / "configs" / "debug_model.toml")) return p / "configs";
    if (p == p.parent_path()) return {};
  }
}

TEST_F(ConfigTest, EveryShippedConfigLoads) {
  const fs::path configs = find_configs_dir();
  ASSERT_FALSE(configs.empty()) << "no configs/debug_model.toml above " << fs::current_path();
  int count = 0;
  for (const auto& entry : fs::recursive_directory_iterator(configs)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    ++count;
    JobConfig c;
    ASSERT_NO_THROW(c = load_config(entry.path()));
    EXPECT_NO_THROW(validate_for_world(c, 1));
    const fs::path out = dir_ / "rendered.toml";
    write_config(c, out);
    EXPECT_EQ(load_config(out), c);
  }
  EXPECT_GE(count, 2);

  const JobConfig debug = load_config(configs / "debug_model.toml");
  EXPECT_EQ(debug.model.flavor, "debugmodel");
  EXPECT_EQ(debug.training.device, "cpu");
  EXPECT_LE(debug.training.steps, 1000);
  const JobConfig big = load_config(configs / "llama3_8b.toml");
  EXPECT_EQ(big.model.flavor, "8B");
  EXPECT_EQ(big.training.seq_len, 8192);
  EXPECT_DOUBLE_EQ(big.optimizer.lr, 3e-4);
  EXPECT_EQ(validate_for_world(big, 8).dp_shard, 8);
}

}  // namespace
}  // namespace mt::train::config
