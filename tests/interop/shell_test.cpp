// The shell interpreter of launch scripts (interop/shell.hpp): what bash would pass to the command.
#include "interop/shell.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include <filesystem>
#include <fstream>

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


TEST(ShellWords, ArraysQuotedAndUnquotedAsBashSplitsThem) {
  // Llama 3's launch script: quoted items stay one item, "${A[@]}" gives one word per item,
  // unquoted ${A[@]} splits each item.
  const std::string script =
      "MODEL_ARGS=(\n"
      "  \"--num-layers 32\"   # one item\n"
      "  --hidden-size 4096\n"
      ")\n"
      "MODEL_ARGS+=(--vocab-size 128256)\n"
      "EXTRA=()\n"
      "EXTRA+=(\"--data-path\" \"my data\")\n"
      "echo ${#MODEL_ARGS[@]} items\n"
      "run ${MODEL_ARGS[@]} \"${EXTRA[@]}\" \"${NONE[@]}\" --n ${#MODEL_ARGS[@]} --second ${MODEL_ARGS[1]}\n"
      "run2 \"${MODEL_ARGS[@]}\"\n";
  EXPECT_EQ(shell_words(script, "t.sh"),
            (Words{"run", "--num-layers", "32", "--hidden-size", "4096", "--vocab-size", "128256", "--data-path", "my data", "--n", "5",
                   "--second", "--hidden-size", "run2", "--num-layers 32", "--hidden-size", "4096", "--vocab-size", "128256"}));
}

TEST(ShellWords, ArithmeticCaseFunctionsAndLoops) {
  const std::string script =
      "GPUS_PER_NODE=8\nNNODES=${SLURM_NNODES:-4}\n"
      "WORLD_SIZE=$(( GPUS_PER_NODE * NNODES ))\n"
      "(( WORLD_SIZE > 16 )) && BIG=1\n"
      "MODEL=${MODEL:-7B}\n"
      "case $MODEL in\n"
      "  7B|8B) L=32; H=4096 ;;\n"
      "  70B) L=80; H=8192 ;;\n"
      "  *) L=2; H=64 ;;\n"
      "esac\n"
      "add_arg() {\n"
      "  local flag=$1\n"
      "  ARGS+=(\"--$flag\" \"$2\")\n"
      "}\n"
      "function layers { add_arg num-layers $L; }\n"
      "layers\n"
      "add_arg hidden-size $H\n"
      "for pair in a b; do ARGS+=(--$pair); done\n"
      "i=0\nwhile [ $i -lt 3 ]; do i=$((i + 1)); done\n"
      "for ((k = 0; k < 2; k++)); do ARGS+=(--k$k); done\n"
      "cat <<EOF > config.json\n{\"not\": \"arguments\"}\nEOF\n"
      "torchrun --nnodes $NNODES --world $WORLD_SIZE pretrain_gpt.py \"${ARGS[@]}\" --i $i --big ${BIG:-0} --flag ${flag:-unset} 2>&1 | tee log.txt\n";
  EXPECT_EQ(shell_words(script, "t.sh"),
            (Words{"torchrun", "--nnodes", "4", "--world", "32", "pretrain_gpt.py", "--num-layers", "32", "--hidden-size", "4096", "--a", "--b",
                   "--k0", "--k1", "--i", "3", "--big", "1", "--flag", "unset"}));
  EXPECT_EQ(shell_words(script, "t.sh", {{"MODEL", "70B"}, {"SLURM_NNODES", "1"}}),
            (Words{"torchrun", "--nnodes", "1", "--world", "8", "pretrain_gpt.py", "--num-layers", "80", "--hidden-size", "8192", "--a", "--b",
                   "--k0", "--k1", "--i", "3", "--big", "0", "--flag", "unset"}));
}

TEST(ShellWords, ParameterOperatorsAndEval) {
  const std::string script =
      "P=/data/llama/tokenizer.model\nN=Llama\n"
      "run ${P##*/} ${P%/*} ${P#/data/} ${P/llama/mistral} ${N,,} ${N^^} ${N:1:3} ${N:+set} ${U:+set} x${#N}\n"
      "CMD=\"run2 --a 1\"\neval $CMD --b 2\n";
  EXPECT_EQ(shell_words(script, "t.sh"), (Words{"run", "tokenizer.model", "/data/llama", "llama/tokenizer.model",
                                                "/data/mistral/tokenizer.model", "llama", "LLAMA", "lam", "set", "x5", "run2", "--a", "1",
                                                "--b", "2"}));
}

TEST(ShellWords, SourceReadsTheFileNextToTheScript) {
  std::vector<std::string> asked;
  const ShellFileReader read = [&](const std::string& path, std::string* name) {
    asked.push_back(path);
    *name = "dir/" + path;
    if (path != "model.sh") throw ConfigError("script", "no such file", SourceLocation{"t.sh", 1, 1});
    return std::string("L=48\nhelper() { echo no; X=--from-source; }\n");
  };
  EXPECT_EQ(shell_words("source model.sh\n. model.sh\nhelper\nrun --num-layers $L $X\n", "t.sh", {}, read),
            (Words{"run", "--num-layers", "48", "--from-source"}));
  EXPECT_EQ(asked, (Words{"model.sh", "model.sh"}));
  // A file that cannot be read (a cluster's environment setup) is skipped with a note naming it.
  const ShellRun skipped = run_shell("source other.sh\nrun --a\n", "t.sh", {}, read, {});
  EXPECT_EQ(skipped.words, (Words{"run", "--a"}));
  ASSERT_EQ(skipped.notes.size(), 1u);
  EXPECT_NE(skipped.notes[0].find("t.sh:1: skipped `source other.sh`"), std::string::npos) << skipped.notes[0];
  EXPECT_THROW(shell_words("source model.sh\n", "t.sh"), ConfigError);  // no reader: refused, not ignored
}

TEST(ShellWords, UnknowableValuesStayAsWrittenAndConditionsOnThemNeedEnv) {
  // The output of a command is not known: as an argument it stays as written, in a condition it
  // is refused naming the variable to give.
  EXPECT_EQ(shell_words("G=$(nvidia-smi -L | wc -l)\nrun --gpus $G --n $(( G * 2 ))\n", "t.sh"),
            (Words{"run", "--gpus", "$(nvidia-smi -L | wc -l)", "--n", "$(( G * 2 ))"}));
  try {
    shell_words("G=$(nvidia-smi -L | wc -l)\n\nif (( G > 4 )); then A=1; fi\n", "t.sh");
    FAIL() << "decided on the output of a command";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("t.sh:3"), std::string::npos) << what;
    EXPECT_NE(what.find("--env G=VALUE"), std::string::npos) << what;
  }
  // --env gives it; the script's unknowable assignment does not replace it.
  EXPECT_EQ(shell_words("G=$(nvidia-smi -L | wc -l)\nif [[ $G -gt 4 ]]; then run --big; fi\n", "t.sh", {{"G", "8"}}), (Words{"run", "--big"}));
  // A case on an environment variable, and a variable set from one.
  try {
    shell_words("S=$SIZE\ncase $S in\n  big) L=96 ;;\nesac\n", "t.sh");
    FAIL() << "guessed SIZE";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--env SIZE=VALUE"), std::string::npos) << e.what();
  }
  // What is not evaluated does not matter (short-circuit), file tests are false.
  EXPECT_EQ(shell_words("if [[ -n \"${X:-}\" && $X == 1 ]] || [ -d /ckpt ]; then run --a; else run --b; fi\n", "t.sh"), (Words{"run", "--b"}));
}

TEST(ShellWords, MalformedScriptsAreConfigErrorsWithTheirLine) {
  auto line_of = [](const std::string& script) {
    try {
      shell_words(script, "t.sh");
    } catch (const ConfigError& e) {
      return e.where().line;
    }
    return -1;
  };
  EXPECT_EQ(line_of("A=1\ncase $A in\n  1) B=2\n"), 4);           // no esac
  EXPECT_EQ(line_of("A=(1 2\n"), 2);                              // array not closed
  EXPECT_EQ(line_of("A=1\nB=$(( 1 / 0 ))\n"), 2);                 // division by zero
  EXPECT_EQ(line_of("A=1\nB=$(( 9223372036854775807 + 1 ))\n"), 2);  // overflow
  EXPECT_EQ(line_of("f() { f; }\nf\n"), 1);                       // recursion without end
  EXPECT_EQ(line_of("\nwhile true; do A=1; done\n"), 2);          // a loop without end
  // A loop that grows an array by one item copies it each time: bounded by the items copied
  // (found by fuzzing: 200 000 appends took minutes), refused at once and naming the line.
  EXPECT_EQ(line_of("A=()\nwhile true; do A+=(--x); done\n"), 2);
  EXPECT_EQ(line_of("A=(1)\nwhile true; do A=(\"${A[@]}\"); done\n"), 2);
  EXPECT_EQ(line_of("A=1\ndone\n"), 2);
  EXPECT_EQ(line_of("A=1\nX=${A:?is required}\nY=${B:?is required}\n"), 3);
}

// A folder of its own under the system's temporary one, removed at the end.
struct Folder {
  std::filesystem::path path;
  explicit Folder(const std::string& name)
      : path(std::filesystem::temp_directory_path() / ("ptdp-shell-" + name + "-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()))) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~Folder() { std::filesystem::remove_all(path); }
  void touch(const std::string& file) const { std::ofstream(path / file) << "x"; }
};

TEST(ShellContext, WhereTheScriptIsAndRunsIsKnown) {
  ShellContext at;
  at.script_path = "/work/megatron/examples/train.sh";
  at.cwd = "/work/megatron";
  const ShellRun r = run_shell(
      "DIR=$(dirname \"$0\")\n"
      "HERE=$(cd \"$(dirname \"${BASH_SOURCE[0]}\")\" && pwd)\n"
      "ROOT=`pwd`\n"
      "run --a $PWD --b $DIR --c $HERE --d $ROOT --e $(basename $0) --f $(realpath ../data)\n",
      "train.sh", {}, nullptr, at);
  EXPECT_EQ(r.words, (Words{"run", "--a", "/work/megatron", "--b", "/work/megatron/examples", "--c", "/work/megatron/examples", "--d",
                            "/work/megatron", "--e", "train.sh", "--f", "/work/data"}));
  // What it cannot know stays unknown: a condition on it is refused, naming the substitution.
  try {
    run_shell("if [ \"$(hostname)\" = a ]; then run; fi\n", "t.sh", {}, nullptr, at);
    FAIL() << "guessed hostname";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("$(hostname)"), std::string::npos) << e.what();
  }
  // A value from $PWD splits like any other: an array of paths built from it (NVIDIA's scripts).
  const ShellRun arr = run_shell("TOK=(--vocab-file $PWD/vocab.json --merge-file $PWD/merges.txt)\nrun \"${TOK[@]}\"\n", "t.sh", {}, nullptr, at);
  EXPECT_EQ(arr.words, (Words{"run", "--vocab-file", "/work/megatron/vocab.json", "--merge-file", "/work/megatron/merges.txt"}));
}

TEST(ShellContext, FileTestsLookAtTheFolderAndExitIsNamed) {
  const Folder megatron("megatron"), elsewhere("elsewhere");
  megatron.touch("pretrain_gpt.py");
  const std::string script =
      "#!/bin/bash\n"
      "if [ ! -f pretrain_gpt.py ]; then\n"
      "  echo run me from Megatron-LM; exit 1\n"
      "fi\n"
      "LOAD=\n"
      "[ -d checkpoints ] && LOAD=\"--load checkpoints\"\n"
      "torchrun pretrain_gpt.py --num-layers 2 $LOAD\n";
  ShellContext at;
  at.cwd = megatron.path.string();
  ShellRun r = run_shell(script, "llama.sh", {}, nullptr, at);
  EXPECT_EQ(r.words, (Words{"torchrun", "pretrain_gpt.py", "--num-layers", "2"}));
  EXPECT_TRUE(r.exit_where.empty());
  // Run elsewhere, the guard stops the script: the line and the command are named.
  at.cwd = elsewhere.path.string();
  r = run_shell(script, "llama.sh", {}, nullptr, at);
  EXPECT_TRUE(r.words.empty());
  EXPECT_EQ(r.exit_where, "llama.sh:3:33");
  EXPECT_EQ(r.exit_command, "exit 1");
  EXPECT_EQ(r.exit_status, 1);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_NE(r.notes[0].find("llama.sh:2: [ -f pretrain_gpt.py ] is false, looking in " + elsewhere.path.string()), std::string::npos)
      << r.notes[0];
  // --assume-files: every file test holds, with a note.
  at.assume_files = true;
  r = run_shell(script, "llama.sh", {}, nullptr, at);
  EXPECT_EQ(r.words, (Words{"torchrun", "pretrain_gpt.py", "--num-layers", "2", "--load", "checkpoints"}));
  EXPECT_NE(r.notes[0].find("taken as true (--assume-files)"), std::string::npos) << r.notes[0];
}

TEST(ShellContext, BashAndShDashCStringsRun) {
  // BLOOM's launch: the command is a string run by bash -c after srun; the SC'21 scripts: sh -c "${CMD}".
  ShellRun r = run_shell(
      "export LAUNCHER=\"python -m torch.distributed.run --nproc_per_node 8\"\n"
      "export CMD=\" pretrain_gpt.py --num-layers 70 --hidden-size 14336\"\n"
      "srun --jobid $SLURM_JOBID bash -c \"$LAUNCHER --node_rank \\$SLURM_PROCID $CMD\" 2>&1 | tee log.txt\n",
      "bloom.sh", {}, nullptr, {});
  EXPECT_EQ(r.words, (Words{"srun", "--jobid", "$SLURM_JOBID", "python", "-m", "torch.distributed.run", "--nproc_per_node", "8",
                            "--node_rank", "$SLURM_PROCID", "pretrain_gpt.py", "--num-layers", "70", "--hidden-size", "14336"}));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("bloom.sh:3: ran the string of `bash -c`"), std::string::npos) << r.notes[0];
  r = run_shell("CMD=\"python pretrain_gpt.py --num-layers 96\"\nsh -c \"${CMD}\"\nrun --after\n", "sc21.sh", {}, nullptr, {});
  EXPECT_EQ(r.words, (Words{"python", "pretrain_gpt.py", "--num-layers", "96", "run", "--after"}));
  // An exit inside the string ends that shell only.
  r = run_shell("bash -c 'run --a; exit 3'\nrun --b\n", "t.sh", {}, nullptr, {});
  EXPECT_EQ(r.words, (Words{"run", "--a", "run", "--b"}));
  EXPECT_TRUE(r.exit_where.empty());
}

TEST(ShellContext, SourcesWithUnknownNamesAreSkippedWithANote) {
  const ShellFileReader read = [](const std::string& path, std::string* name) {
    *name = path;
    if (path == "/work/x/CONFIG.sh") return std::string("L=24\n");
    throw ConfigError("file", "cannot open '" + path + "'");
  };
  ShellContext at;
  at.cwd = "/work/x";
  const ShellRun r = run_shell("source $six_ALL_CCFRWORK/start-prod\nsource `pwd`/CONFIG.sh\nrun --num-layers $L\n", "t.sh", {}, read, at);
  EXPECT_EQ(r.words, (Words{"run", "--num-layers", "24"}));
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_NE(r.notes[0].find("t.sh:1: skipped `source $six_ALL_CCFRWORK/start-prod`: the file's name depends on a variable"),
            std::string::npos)
      << r.notes[0];
}

}  // namespace
}  // namespace ptdp

// Issue 36: the interpreter against real bash. Each script runs twice — through shell_words, and
// through /bin/bash with `run` defined to print its arguments — and the words must agree.
namespace ptdp {
namespace {

std::vector<std::string> bash_words(const std::string& script) {
  char path[] = "/tmp/ptdp-shell-XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  const std::string text = "run() { printf 'run\\0'; printf '%s\\0' \"$@\"; }\n" + script;
  EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  FILE* p = popen(("/bin/bash " + std::string(path) + " 2>/dev/null").c_str(), "r");
  std::string out;
  char buf[4096];
  for (size_t n; p != nullptr && (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (p != nullptr) pclose(p);
  unlink(path);
  std::vector<std::string> words;
  for (size_t at = 0; at < out.size();) {
    const size_t end = out.find('\0', at);
    words.push_back(out.substr(at, end - at));
    at = end + 1;
  }
  return words;
}

void expect_as_bash(const std::string& script) {
  SCOPED_TRACE(script);
  const std::vector<std::string> bash = bash_words(script);
  ASSERT_FALSE(bash.empty()) << "bash printed nothing";
  EXPECT_EQ(shell_words(script, "t.sh"), bash);
}

TEST(ShellAsBash, ArithmeticShortCircuitsLikeBash) {
  expect_as_bash("a=$(( 0 && 1/0 )); b=$(( 1 || 1/0 )); c=$(( 1 ? 2 : 1/0 )); d=$(( 0 ? 1/0 : 3 ))\n"
                 "x=3; e=$(( 0 && (x=7) )); f=$(( 1 || (x=8) )); g=$(( 0 ? (x=9) : 4 ))\n"
                 "run \"$a\" \"$b\" \"$c\" \"$d\" \"$e\" \"$f\" \"$g\" \"$x\"\n"
                 "n=5; (( n > 3 && (m = n * 2) )); run \"$m\"\n");
}

TEST(ShellAsBash, PowersOfNegativeBasesAndShifts) {
  expect_as_bash("run $(( (-1)**3 )) $(( (-1)**4 )) $(( (-2)**3 )) $(( -2**2 )) $(( 2**3**2 )) $(( 0**0 )) $(( 1**99 ))\n"
                 "run $(( -1 << 2 )) $(( -8 >> 1 )) $(( 1 << 62 )) $(( 8 >> 64 )) $(( 1 << 64 )) $(( 3 << 65 )) $(( -7 >> 63 ))\n");
}

TEST(ShellAsBash, EachCommandOfAPipelineIsASubshell) {
  expect_as_bash("x=1; x=2 | true; y=a; true | y=b; false && z=1 | true\n"
                 "f() { w=inner; }; f | cat\n"
                 "true || v=1 | true; u=0; (( u = 4 )) | true\n"
                 "run \"$x\" \"$y\" \"${z-unset}\" \"${w-unset}\" \"${v-unset}\" \"$u\"\n"
                 "true | run piped\n");
}

TEST(ShellAsBash, PrintfMinusVAssigns) {
  expect_as_bash("printf -v a '%05d-%s' 42 x; printf -v b '%s,' p q r; printf -v c '%.2f' 3.14159\n"
                 "printf -v d '%x|%X|%o' 255 255 8; printf -v e '%-4s|%4s' ab cd; printf -v f 'n=%d\\t%%' 7\n"
                 "printf -v g '%s' ''; printf -v h '%d' 0x1f\n"
                 "run \"$a\" \"$b\" \"$c\" \"$d\" \"$e\" \"$f\" \"[$g]\" \"$h\"\n");
}

TEST(ShellAsBash, DeclareMinusIAndLet) {
  expect_as_bash("declare -i n=2+3; n+=4; m=7; declare -i m; m=m*2; s=1+1\n"
                 "g() { local -i k=3*3; run \"$k\"; }; g\n"
                 "let a=2+3 b=a*2; let \"c = b - 1\"; if let \"a > 10\"; then r=big; else r=small; fi\n"
                 "let 'q = 0'; st=$?\n"
                 "run \"$n\" \"$m\" \"$s\" \"$a\" \"$b\" \"$c\" \"$r\"\n");
}

TEST(ShellAsBash, IfsSplitsWords) {
  expect_as_bash("list='a,b,,c'; IFS=,; for x in $list; do run \"[$x]\"; done\n"
                 "arr=(p q r); run \"${arr[*]}\"; run $list\n"
                 "v='a , b,c ,'; IFS=', '; run $v\n"
                 "IFS=' '; w='x  y'; run $w\n"
                 "unset IFS; run $w \"${arr[*]}\"\n");
}

}  // namespace
}  // namespace ptdp
