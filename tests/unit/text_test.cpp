// Text for people and logs: control characters escaped, rank lists as a user writes them.
#include "util/text.hpp"

#include <gtest/gtest.h>

namespace clairfs {
namespace {

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
