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

TEST(ShellWords, OnlyTheBranchBashTakesCounts) {
  // A script that picks the model by MODEL_SIZE: the 1.7B branch, not the last one written.
  const std::string script =
      "MODEL_SIZE=1.7\n"
      "CKPT=\"false\"\n"
      "if [ \"$MODEL_SIZE\" == 1.7 ]; then\n"
      "  L=24\n"
      "elif [[ $MODEL_SIZE == 1T ]]; then\n"
      "  L=128\n"
      "else\n"
      "  L=2\n"
      "fi\n"
      "N=${NODES:-1}\n"
      "if [ $N -gt 1 ]; then EXTRA=--multi; else EXTRA=--single; fi\n"
      "if [ \"$CKPT\" = \"true\" ]; then\n"
      "  if [ 1 -eq 1 ]; then R=--recompute-activations; fi\n"
      "else\n"
      "  R=\n"
      "fi\n"
      "run --num-layers $L $EXTRA $R\n";
  EXPECT_EQ(shell_words(script, "t.sh"), (Words{"run", "--num-layers", "24", "--single"}));
  // The environment given with --env decides the same conditions.
  EXPECT_EQ(shell_words(script, "t.sh", {{"NODES", "4"}}), (Words{"run", "--num-layers", "24", "--multi"}));
}

TEST(ShellWords, AConditionOnAnUnsetEnvironmentVariableNamesTheLineAndAsksForEnv) {
  try {
    shell_words("A=1\n\nif [ \"$SIZE\" == big ]; then\n  L=96\nfi\nrun --num-layers $L\n", "t.sh");
    FAIL() << "guessed the value of SIZE";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("t.sh:3"), std::string::npos) << what;
    EXPECT_NE(what.find("--env SIZE=VALUE"), std::string::npos) << what;
  }
  EXPECT_THROW(shell_words("if [ 1 -eq 1 ]; then\nA=1\n", "t.sh"), ConfigError);   // no fi
  EXPECT_THROW(shell_words("fi\n", "t.sh"), ConfigError);
  EXPECT_THROW(shell_words("if [ a -gt 1 ]; then A=1; fi\n", "t.sh"), ConfigError);  // not an integer
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
