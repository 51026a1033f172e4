// The fixed layout of .clairfs/stats: every scalar right-aligned in one width, so the length never changes.
#include "util/text.hpp"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace clairfs {
namespace {

TEST(FixedWidthScalars, PadsEveryScalarOutsideStrings) {
  EXPECT_EQ(fixed_width_scalars(R"({"a": 1, "b": [true, null], "c": "x 1, false"})", 6),
            R"({"a":      1, "b": [  true,   null], "c": "x 1, false"})");
  EXPECT_EQ(fixed_width_scalars(R"({"q": "say \"2\"", "n": -0.5e-3})", 8), R"({"q": "say \"2\"", "n":  -0.5e-3})");
}

TEST(FixedWidthScalars, KeepsTheLengthWhateverTheValuesAndStaysJson) {
  auto render = [](uint64_t n, double d, bool b) {
    nlohmann::json j;
    j["files"] = n;
    j["seconds"] = d;
    j["live"] = b;
    j["ranks"] = {{{"rank", n % 7}, {"lead", d * 3}}};
    return fixed_width_scalars(j.dump(2), 24);
  };
  const std::string a = render(0, 0.0, false);
  const std::string b = render(18446744073709551615ull, -1.2345678901234567e-308, true);
  EXPECT_EQ(a.size(), b.size());
  EXPECT_EQ(nlohmann::json::parse(b)["files"], 18446744073709551615ull);
  EXPECT_EQ(nlohmann::json::parse(a)["live"], false);
}

TEST(FixedWidthScalars, LeavesALongerScalarAsItIs) { EXPECT_EQ(fixed_width_scalars("[12345]", 3), "[12345]"); }

TEST(EscapeControls, ANameCanNeitherForgeALineNorReachTheTerminal) {
  EXPECT_EQ(escape_controls("a\nclairfs: forged\x1b[2J\x7f"), "a\\x0aclairfs: forged\\x1b[2J\\x7f");
  EXPECT_EQ(escape_controls("tab\there"), "tab\\x09here");
}

TEST(EscapeControls, KeepsUtf8AndIsUnambiguous) {
  EXPECT_EQ(escape_controls("caf\xc3\xa9/\xe7\x8c\xab.jpg"), "caf\xc3\xa9/\xe7\x8c\xab.jpg");
  // A name that already reads "\x0a" stays apart from one holding a newline.
  EXPECT_EQ(escape_controls("\\x0a"), "\\\\x0a");
}

TEST(RankListText, WritesRanksAsAUserWould) {
  EXPECT_EQ(rank_list_text({0, 1, 2, 3}), "0-3");
  EXPECT_EQ(rank_list_text({0, 1}), "0,1");
  EXPECT_EQ(rank_list_text({0, 2, 5}), "0,2,5");
  EXPECT_EQ(rank_list_text({0, 1, 2, 3, 8}), "0-3,8");
  EXPECT_EQ(rank_list_text({}), "none");
}

}  // namespace
}  // namespace clairfs
