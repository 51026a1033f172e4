// Unit tests for the mount command line: every bad input is a UsageError naming the culprit, and the
// accepted spellings all mean what the documentation says.
#include <sys/resource.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "clairfs/options.hpp"
#include "options/table.hpp"

namespace clairfs {
namespace {

class OptionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/clairfs-options-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    std::filesystem::create_directories(dir_ + "/src");
    std::filesystem::create_directories(dir_ + "/mnt");
    std::filesystem::create_directories(dir_ + "/nvme");
    std::ofstream(dir_ + "/file") << "x";
    std::ofstream(dir_ + "/order.txt") << "a.png\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  Options parse(const std::vector<std::string>& extra, std::string src = "", std::string mnt = "") {
    std::vector<std::string> args = {"clairfs", src.empty() ? dir_ + "/src" : src, mnt.empty() ? dir_ + "/mnt" : mnt};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<const char*> argv;
    for (auto& a : args) argv.push_back(a.c_str());
    return parse_mount_command(static_cast<int>(argv.size()), argv.data());
  }
  Options parse_o(const std::string& o) { return parse({"-o", o}); }

  // The error message for -o o, which must name `culprit`.
  std::string error_of(const std::vector<std::string>& extra, std::string src = "", std::string mnt = "") {
    try {
      parse(extra, src, mnt);
    } catch (const UsageError& e) {
      std::string m = e.what();
      EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
      return m;
    }
    ADD_FAILURE() << "no error for the given arguments";
    return "";
  }

  std::string dir_;
};

TEST_F(OptionsTest, DefaultsMatchTheDocumentation) {
  Options o = parse({});
  EXPECT_EQ(o.seed, 0);
  EXPECT_EQ(o.batch_size, 1u);
  EXPECT_EQ(o.world_size, 1u);
  EXPECT_EQ(o.ranks, std::vector<uint64_t>{0});
  EXPECT_FALSE(o.epochs.has_value());
  EXPECT_EQ(o.prefetch_factor, 2u);
  EXPECT_EQ(o.order, Order::kTorch);
  EXPECT_EQ(o.extensions, default_extensions());
  EXPECT_FALSE(o.foreground);
  EXPECT_GE(o.entry_timeout, 3600);
  EXPECT_EQ(o.fsname, o.source_abs);
}

TEST_F(OptionsTest, ParsesEveryOption) {
  Options o = parse({"-f", "-o", "seed=-7,batch_size=64,world_size=8,ranks=2-3,epochs=90,start_epoch=5",
                     "-o", "drop_last,loader_drop_last=false,workers=4,prefetch_factor=3,order=sequential",
                     "-o", "extensions=JPG:.png,ram=1.5G,nvme=" + dir_ + "/nvme,nvme_size=2M,timeout=5"});
  EXPECT_TRUE(o.foreground);
  EXPECT_EQ(o.seed, -7);
  EXPECT_EQ(o.batch_size, 64u);
  EXPECT_EQ(o.world_size, 8u);
  EXPECT_EQ(o.ranks, (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(*o.epochs, 90u);
  EXPECT_EQ(o.start_epoch, 5u);
  EXPECT_TRUE(o.drop_last);
  EXPECT_FALSE(o.loader_drop_last);
  EXPECT_EQ(o.workers, 4u);
  EXPECT_EQ(o.prefetch_factor, 3u);
  EXPECT_EQ(o.order, Order::kSequential);
  EXPECT_EQ(o.extensions, (std::vector<std::string>{".jpg", ".png"}));
  EXPECT_EQ(o.ram, 3ull << 29);
  EXPECT_EQ(o.nvme_size, 2ull << 20);
  EXPECT_EQ(o.entry_timeout, 5.0);
  EXPECT_EQ(o.attr_timeout, 5.0);
}

TEST_F(OptionsTest, DashAndUnderscoreSpellTheSameKey) {
  Options o = parse_o("batch-size=32,world-size=4,ranks-per-node=2,loader-drop-last,prefetch-factor=4");
  EXPECT_EQ(o.batch_size, 32u);
  EXPECT_EQ(o.world_size, 4u);
  EXPECT_EQ(o.ranks_per_node, 2u);
  EXPECT_EQ(o.ranks, (std::vector<uint64_t>{0, 1}));
  EXPECT_TRUE(o.loader_drop_last);
  EXPECT_EQ(o.prefetch_factor, 4u);
}

TEST_F(OptionsTest, RankListsRunAcrossCommas) {
  EXPECT_EQ(parse_o("world_size=8,ranks=0,2,5,seed=1").ranks, (std::vector<uint64_t>{0, 2, 5}));
  EXPECT_EQ(parse_o("world_size=8,ranks=0-2,6").ranks, (std::vector<uint64_t>{0, 1, 2, 6}));
  EXPECT_EQ(parse_o("world_size=8,ranks=3").ranks, (std::vector<uint64_t>{3}));
  const Options any = parse_o("world_size=auto");  // planned as 1 until the job shows its world size
  EXPECT_TRUE(any.world_size_auto);
  EXPECT_EQ(any.world_size, 1u);
  EXPECT_EQ(any.ranks, (std::vector<uint64_t>{0}));
  EXPECT_EQ(parse_o("world_size=8,ranks=1:4").ranks, (std::vector<uint64_t>{1, 4}));
  EXPECT_EQ(parse_o("world_size=8,ranks=4,2,2").ranks, (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(parse_o("extensions=jpg,png,ro").extensions, (std::vector<std::string>{".jpg", ".png"}));
}

TEST_F(OptionsTest, SeedsFollowPythonIntegersWithinTorchRange) {
  EXPECT_EQ(parse_o("seed=4294967296").seed, SeedInt{1} << 32);
  EXPECT_EQ(parse_o("seed=18446744073709551615").seed, (SeedInt{1} << 64) - 1);
  EXPECT_EQ(parse_o("seed=-9223372036854775808").seed, -(SeedInt{1} << 63));
  EXPECT_NE(error_of({"-o", "seed=18446744073709551616"}).find("seed"), std::string::npos);
  EXPECT_NE(error_of({"-o", "seed=-9223372036854775809"}).find("seed"), std::string::npos);
}

TEST_F(OptionsTest, LearnFromNamesUsersOrAnyone) {
  EXPECT_TRUE(parse_o("seed=auto").learn_from.empty());
  EXPECT_FALSE(parse_o("seed=auto").learn_from_any);
  EXPECT_TRUE(parse_o("learn_from=any").learn_from_any);
  EXPECT_EQ(parse_o("learn_from=1000:0:4294967294").learn_from, (std::vector<uid_t>{1000, 0, 4294967294u}));
  for (const char* bad : {"learn_from=", "learn_from=1000:", "learn_from=x", "learn_from=4294967295", "learn_from=-1"})
    EXPECT_NE(error_of({"-o", bad}).find("learn_from"), std::string::npos) << bad;
}

TEST_F(OptionsTest, SizesTakeBinarySuffixes) {
  EXPECT_EQ(parse_size("ram", "4096"), 4096u);
  EXPECT_EQ(parse_size("ram", "64K"), 65536u);
  EXPECT_EQ(parse_size("ram", "64k"), 65536u);
  EXPECT_EQ(parse_size("ram", "2M"), 2u << 20);
  EXPECT_EQ(parse_size("ram", "2MB"), 2u << 20);
  EXPECT_EQ(parse_size("ram", "2MiB"), 2u << 20);
  EXPECT_EQ(parse_size("ram", "3G"), 3ull << 30);
  EXPECT_EQ(parse_size("ram", "1T"), 1ull << 40);
  for (const char* bad : {"12XB", "", "G", "-1G", "1.5", "1e3", " 5", "5 G", "0x10", "1GG", "99999999999P"})
    EXPECT_THROW(parse_size("ram", bad), UsageError) << bad;
}

TEST_F(OptionsTest, EveryBadInputNamesItsCulprit) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"frobnicate=1", "frobnicate"},
      {"seed=abc", "seed"},
      {"seed=", "seed"},
      {"seed=1.5", "seed"},
      {"batch_size=0", "batch_size"},
      {"batch_size=-1", "batch_size"},
      {"batch_size=abc", "batch_size"},
      {"world_size=0", "world_size"},
      {"world_size=auto,ranks=0", "world_size=auto"},
      {"world_size=auto,ranks_per_node=2", "world_size=auto"},
      {"world_size=auto,order=sequential", "world_size=auto"},
      {"world_size=auto,ram=0", "world_size=auto"},
      {"world_size=auto,batch_size=1,workers=4", "world_size=auto"},
      {"ram=12XB", "ram"},
      {"nvme_size=lots,nvme=/tmp", "nvme_size"},
      {"nvme_size=0,nvme=/tmp", "nvme_size"},  // not "no tier": 0 is the default size, most of the disk
      {"world_size=4,ranks=4", "rank 4"},
      {"world_size=4,ranks=1-9", "rank"},
      {"world_size=4,ranks=3-1", "ranks"},
      {"world_size=4,ranks=a", "ranks"},
      {"world_size=4", "world_size=4"},
      {"world_size=4,ranks=1,ranks_per_node=2", "ranks_per_node"},
      {"world_size=2,ranks_per_node=3", "ranks_per_node"},
      {"epochs=0", "epochs"},
      {"epochs=3,start_epoch=3", "start_epoch"},
      {"drop_last=maybe", "drop_last"},
      {"workers=-2", "workers"},
      {"prefetch_factor=0", "prefetch_factor"},
      {"order=random", "order"},
      {"order=list", "order_file"},
      {"order_file=/nonexistent/order", "order_file"},
      {"extensions=", "extensions"},
      {"extensions=a/b", "extensions"},
      {"nvme=/nonexistent/dir", "nvme"},
      {"nvme_size=1G", "nvme_size"},
      {"io_depth=0", "io_depth"},
      {"world_size=8,ranks=18446744073709551615", "rank"},  // found by fuzzing: looped forever
      {"io_depth=5000", "io_depth"},
      {"peer_timeout=0", "peer_timeout"},
      {"peer_timeout=1e300", "peer_timeout"},  // made milliseconds in 64 bits: undefined beyond
      {"idle=0.5", "idle"},
      {"idle=1e12", "idle"},
      {"pagecache=1G,ram=0", "pagecache"},
      {"ram=1M,pagecache=2M", "pagecache"},
      {"ram=0,nvme=/tmp", "nvme"},
      {"progress=sometimes", "progress"},
      {"ram=0,progress=reads", "progress"},
      {"manifest=/nonexistent/manifest", "manifest"},
      {"attr_timeout=-1", "attr_timeout"},
      {"entry_timeout=soon", "entry_timeout"},
      {"allow_other", "allow_other"},
      {"fsname=", "fsname"},
      {"ram=1P", "ram="},  // more than the machine: refused, not OOM-killed later
      {"ram=16G,pagecache=1P", "pagecache"},
      {"log=relative.log", "log"},
      {"log_level=loud", "log_level"},
      {"metrics_file=relative.prom", "metrics_file"},
      {"metrics_file=/nonexistent/m.prom", "metrics_file"},
      {"seed=auto,ram=0", "seed=auto"},
      {"seed=auto,order=sequential", "seed=auto"},
      // Extreme values that mounted and then crashed (a tolerance that overflowed to 0, then a modulo
      // by it; allocations of world_size; a stats read that took minutes): refused, naming the value.
      {"batch_size=576460752303423482,prefetch_factor=1", "batch_size=576460752303423482"},
      {"world_size=4294967296,ranks=0", "world_size=4294967296"},
      {"world_size=1048576,ranks=0-1048575", "ranks on one node"},
      {"world_size=8192,ranks_per_node=8192", "ranks_per_node"},
      {"workers=100000", "workers"},
      {"prefetch_factor=100000", "prefetch_factor"},
      {"start_epoch=99999999999", "start_epoch"},
      {"-d", "inside -o"},  // a flag inside -o was reported as the option '_d'
  };
  for (const auto& [opt, culprit] : cases) {
    const std::string m = error_of({"-o", opt});
    EXPECT_NE(m.find(culprit), std::string::npos) << opt << " -> " << m;
  }
}

TEST_F(OptionsTest, ProgressComesFromReadsWhenStagingUnlessOpensAreNeeded) {
  EXPECT_FALSE(parse_o("ram=1G").progress_from_opens);
  EXPECT_TRUE(parse_o("ram=1G,progress=opens").progress_from_opens);
  EXPECT_TRUE(parse_o("ram=0").progress_from_opens);  // a plain mount serves opens with descriptors
  EXPECT_TRUE(parse_o("ram=1G,trace=" + dir_ + "/trace").progress_from_opens);  // a trace records opens
  EXPECT_NE(error_of({"-o", "ram=1G,progress=reads,trace=" + dir_ + "/trace"}).find("trace"), std::string::npos);
}

TEST_F(OptionsTest, PathsAreChecked) {
  EXPECT_NE(error_of({}, dir_ + "/missing").find("SOURCE"), std::string::npos);
  EXPECT_NE(error_of({}, dir_ + "/file").find("not a directory"), std::string::npos);
  EXPECT_NE(error_of({}, "", dir_ + "/file").find("MOUNTPOINT"), std::string::npos);
  EXPECT_NE(error_of({}, "", dir_ + "/missing").find("MOUNTPOINT"), std::string::npos);
  EXPECT_NE(error_of({"-o", "order=list,order_file=" + dir_ + "/src"}).find("order_file"), std::string::npos);
  EXPECT_NE(error_of({"-o", "nvme=" + dir_ + "/file"}).find("nvme"), std::string::npos);
  EXPECT_NE(error_of({"-o", "manifest=" + dir_ + "/src"}).find("manifest"), std::string::npos);
  EXPECT_NE(error_of({"-x"}).find("-x"), std::string::npos);
  EXPECT_NE(error_of({"extra"}).find("extra"), std::string::npos);
  EXPECT_NE(error_of({"-o"}).find("-o"), std::string::npos);
  std::vector<const char*> one = {"clairfs", "/tmp"};
  EXPECT_THROW(parse_mount_command(2, one.data()), UsageError);
}

TEST_F(OptionsTest, ANonEmptyMountPointIsRefusedUnlessAsked) {
  std::ofstream(dir_ + "/src/a.png") << "x";  // SOURCE as the mount point: it has an entry
  const std::string m = error_of({}, "", dir_ + "/src");
  EXPECT_NE(m.find("not empty"), std::string::npos) << m;
  EXPECT_NE(m.find("1 entry"), std::string::npos) << m;
  EXPECT_NE(m.find("nonempty"), std::string::npos) << m;
  EXPECT_TRUE(parse({"-o", "nonempty"}, "", dir_ + "/src").nonempty);
}

TEST_F(OptionsTest, ARamBudgetBeyondTheNodeIsRefused) {
  EXPECT_NE(error_of({"-o", "ram=1P"}).find("memory"), std::string::npos);
  // Under an address-space limit (ulimit -v), ram= must leave the daemon its own room: it was accepted
  // and the stager thread died of bad_alloc. (Not under a sanitizer: its shadow memory needs no limit.)
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  struct rlimit before {};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &before), 0);
  struct rlimit limited = before;
  limited.rlim_cur = uint64_t{8} << 30;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &limited), 0);
  const std::string m = error_of({"-o", "ram=8G"});
  const uint64_t fits = parse_o("ram=1G").ram;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &before), 0);
  EXPECT_NE(m.find("address-space limit"), std::string::npos) << m;
  EXPECT_EQ(fits, 1ull << 30);
#endif
  EXPECT_GT(parse_o("ram=1M").ram, 0u);
  // An NVMe budget above the disk's free space is warned of at start-up, not refused.
  EXPECT_EQ(parse_o("nvme=" + dir_ + "/nvme,nvme_size=1P").nvme_size, 1ull << 50);
}

TEST_F(OptionsTest, AcceptsWhatMountAndFstabPassOn) {
  // dev and suid are accepted and have no effect: the mount is always nosuid,nodev (fuse/mount.cpp).
  Options o = parse_o("rw,dev,suid,nodev,nosuid,noatime,_netdev,nofail,defaults,x-systemd.automount,x-foo=bar,ro");
  EXPECT_EQ(o.mount_flags, (std::vector<std::string>{"noatime"}));
  Options f = parse_o("allow_other,default_permissions,auto_unmount,fsname=imagenet");
  EXPECT_TRUE(f.allow_other);
  EXPECT_TRUE(f.default_permissions);
  EXPECT_TRUE(f.auto_unmount);
  EXPECT_EQ(f.fsname, "imagenet");
  EXPECT_EQ(parse_o("order=list,order_file=" + dir_ + "/order.txt").order, Order::kList);
  EXPECT_EQ(parse_o("order=torch-random").order, Order::kTorchRandom);
  EXPECT_EQ(parse_o("order=clairfs").order, Order::kClairfs);
  const Options g = parse_o("order=torch-global,draws=100");
  EXPECT_EQ(g.order, Order::kTorchGlobal);
  EXPECT_EQ(g.draws, 100u);
  EXPECT_EQ(parse({"-oseed=9"}).seed, 9);
}

TEST_F(OptionsTest, HelpSaysTheUnitsTheDocsSay) {
  // docs/options.md and the man page say the same words (checked by reading them here would tie this test
  // to a path; the phrase is the contract).
  EXPECT_NE(usage_text().find("K, M, G, T or P (powers of 1024"), std::string::npos);
  EXPECT_NE(usage_text().find("0-3,8 (0 to 3, and 8)"), std::string::npos);
}

TEST_F(OptionsTest, HelpAndVersionAreNotErrors) {
  std::vector<const char*> help = {"clairfs", "--help"};
  EXPECT_THROW(parse_mount_command(2, help.data()), HelpRequested);
  std::vector<const char*> version = {"clairfs", "-V"};
  EXPECT_THROW(parse_mount_command(2, version.data()), HelpRequested);
  // --help lists every option of the table, each once, spelled as it is typed.
  const std::string text = usage_text();
  for (const auto& o : option_table()) {
    const std::string name = "\n  " + std::string(o.name) + (o.takes == Takes::kValue ? "=" : "");
    EXPECT_NE(text.find(name), std::string::npos) << o.name;
    EXPECT_EQ(text.find(name), text.rfind(name)) << o.name;
  }
}

TEST_F(OptionsTest, EveryOptionInTheTableParses) {
  // Bare words and name=BOOL for flags; for valued options, a parse error names the option, which shows
  // the template reached the row's own check (an empty value is wrong for every one of them).
  for (const auto& o : option_table()) {
    const std::string name = o.name;
    if (o.takes != Takes::kValue) {
      EXPECT_NO_THROW(parse_o(name == "allow_other" ? "allow_other,default_permissions" : name)) << name;
      if (o.takes == Takes::kMaybeBool) {
        EXPECT_NO_THROW(parse_o(name + "=no")) << name;
      }
      continue;
    }
    try {
      parse_o(name + "=");
      ADD_FAILURE() << name << "= with no value was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
}

TEST_F(OptionsTest, SplitKeepsEscapedCommas) {
  EXPECT_EQ(split_option_string("fsname=a\\,b,seed=1"), (std::vector<std::string>{"fsname=a,b", "seed=1"}));
  EXPECT_EQ(split_option_string("x-systemd.requires=a-b"), (std::vector<std::string>{"x-systemd.requires=a-b"}));
  EXPECT_EQ(split_option_string("batch-size=2,,"), (std::vector<std::string>{"batch_size=2"}));
}

}  // namespace
}  // namespace clairfs
