// The shell interpreter of launch scripts (interop/shell.hpp): what bash would pass to the command.
#include "interop/shell.hpp"

#include <gtest/gtest.h>

#include "core/error.hpp"

namespace ptdp {
namespace {

using Words = std::vector<std::string>;

TEST(ShellWords, VariablesQuotesCommentsAndContinuations) {
  const Words w = shell_words(
      "#!/bin/bash\n"
      "N=8   # eight\n"
      "export HOST=localhost\n"
      "run --n $N --host ${HOST} \\\n"
      "    --path 'my data/x' --name \"a b\"\n",
      "t.sh");
  EXPECT_EQ(w, (Words{"run", "--n", "8", "--host", "localhost", "--path", "my data/x", "--name", "a b"}));
}

TEST(ShellWords, AVariableOfSeveralWordsSplits) {
  const Words w = shell_words("ARGS=\"--a 1 --b 2\"\nrun $ARGS\n", "t.sh");
  EXPECT_EQ(w, (Words{"run", "--a", "1", "--b", "2"}));
}

TEST(ShellWords, DefaultsOfUnsetVariables) {
  // ${VAR:-d} when VAR is unset or empty, ${VAR-d} only when unset, ${VAR:=d} also assigns.
  const Words w = shell_words(
      "SET=4\nEMPTY=\n"
      "run --a ${SET:-1} --b ${SLURM_NNODES:-2} --c ${EMPTY:-3} --d x${EMPTY-5}y --e ${NEW:=6} --f $NEW --g ${U:-${SET}}\n",
      "t.sh");
  EXPECT_EQ(w, (Words{"run", "--a", "4", "--b", "2", "--c", "3", "--d", "xy", "--e", "6", "--f", "6", "--g", "4"}));
}

TEST(ShellWords, EchoedCommandsAreNotArguments) {
  const Words w = shell_words("echo run --num-layers 24\nrun --num-layers 24\n", "t.sh");
  EXPECT_EQ(w, (Words{"run", "--num-layers", "24"}));
}

TEST(ShellWords, UnterminatedQuoteIsAConfigErrorNamingTheScript) {
  try {
    shell_words("run --name \"abc\n", "t.sh");
    FAIL() << "accepted an unterminated quote";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("t.sh"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("unterminated double quote"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ptdp
