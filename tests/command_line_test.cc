// core/command_line: flag-name normalisation and repeated flags taken out of argv.
#include "core/command_line.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, test_max_side, 0, "a flag with a dash-spelled name, for ParseFlags");

namespace iris::core {
namespace {

std::vector<std::string> TakeImages(std::vector<std::string> in, std::vector<std::string>* rest) {
  std::vector<char*> argv = ArgvOf(in);
  int argc = static_cast<int>(argv.size());
  std::vector<std::string> values = TakeRepeatedFlag(&argc, argv.data(), "image");
  rest->assign(argv.begin(), argv.begin() + argc);
  return values;
}

TEST(CommandLineTest, TakeRepeatedFlagKeepsOrderAndCommas) {
  std::vector<std::string> rest;
  const std::vector<std::string> values =
      TakeImages({"tool", "--image", "a,b.jpg", "--model", "m", "--image=c.png", "--imagex=d", "--image"}, &rest);
  EXPECT_EQ(values, (std::vector<std::string>{"a,b.jpg", "c.png"}));
  // A trailing "--image" without a value and look-alike flags are left for the flag parser.
  EXPECT_EQ(rest, (std::vector<std::string>{"tool", "--model", "m", "--imagex=d", "--image"}));
}

TEST(CommandLineTest, TakeRepeatedFlagStopsAtDoubleDash) {
  std::vector<std::string> rest;
  const std::vector<std::string> values = TakeImages({"tool", "--image=x", "--", "--image", "y"}, &rest);
  EXPECT_EQ(values, (std::vector<std::string>{"x"}));
  EXPECT_EQ(rest, (std::vector<std::string>{"tool", "--", "--image", "y"}));
}

TEST(CommandLineTest, NormalizeFlagNamesOnlyTouchesNamesBeforeDoubleDash) {
  std::vector<std::string> in = {"tool", "--max-pixels=1-2", "-min-pixels", "plain-arg", "--", "--kv-cache"};
  std::vector<char*> argv = ArgvOf(in);
  EXPECT_EQ(NormalizeFlagNames(static_cast<int>(argv.size()), argv.data()),
            (std::vector<std::string>{"tool", "--max_pixels=1-2", "-min_pixels", "plain-arg", "--", "--kv-cache"}));
}

TEST(CommandLineTest, ParseFlagsTakesDashSpellingsAndRefusesPositionals) {
  std::vector<std::string> args = {"prog", "--test-max-side=7"};
  std::vector<char*> argv = ArgvOf(args);
  ASSERT_TRUE(ParseFlags(static_cast<int>(argv.size()), argv.data()).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_max_side), 7);

  args = {"prog", "--test_max_side", "9", "stray", "more"};
  argv = ArgvOf(args);
  const absl::Status st = ParseFlags(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "unexpected argument \"stray\"");
  EXPECT_EQ(absl::GetFlag(FLAGS_test_max_side), 9);
}

}  // namespace
}  // namespace iris::core
