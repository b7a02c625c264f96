// The shell interpreter of launch scripts: a Megatron-LM launch script (bash) becomes the words
// of the commands it runs, for import_megatron.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ptdp {

/// Reads the file a script sources (`source FILE` / `. FILE`, FILE as the script writes it after
/// expansion); throws ConfigError when it cannot. Returns the file's text and sets `*name` to the
/// name errors in it should carry.
using ShellFileReader = std::function<std::string(const std::string& path, std::string* name)>;

/// Runs a launch script as bash would, as far as an import can know, and returns the words of the
/// commands it runs (torchrun, python, srun, …), in order. Understood: quotes, escapes, comments,
/// `\` continuations, here-documents (skipped), redirections (dropped); variables and arrays
/// (`A=v`, `A+=v`, `A=( … )`, `A+=( … )`, `export`, `local`, `declare`, `unset`), parameter
/// expansion (`$A`, `${A:-d}`, `${A-d}`, `${A:=d}`, `${A:+x}`, `${A#p}`, `${A%p}`, `${A/p/r}`,
/// `${A,,}`, `${A^^}`, `${A:o:n}`, `${#A}`, `"${A[@]}"` one word per item, `${#A[@]}`, `${A[i]}`)
/// with word splitting of unquoted expansions by $IFS, arithmetic `$(( ))`, `(( ))` and `let`
/// (short-circuit as bash), `declare -i`, `printf -v`, `if/elif/else`, `case`, `for`,
/// `while`/`until`, `&&`/`||`, pipelines (each command a subshell), `[ ]`, `[[ ]]` and `test`,
/// functions with their arguments, `source`/`.` (through `read`), `eval`, `exit`/`return`.
/// `echo`/`printf` and commands that only manage files (cd, mkdir, cp, …) contribute no words.
///
/// What the script cannot know — environment variables it does not set, the output of `$( )` —
/// stays as written (`$NAME`) in the words; a condition that depends on it is a ConfigError
/// naming `source:line` and asking for `--env NAME=VALUE`. `env` holds those values (a script's
/// assignment of an unknowable value keeps the given one). The script runs without arguments
/// (`$#` is 0); file tests (`-e`, `-f`, `-d`, …) are false. Bounded: at most 200 000 commands
/// run, 64 levels of functions/source/eval, 1 MiB per variable, 16 MiB of words.
std::vector<std::string> shell_words(const std::string& script, const std::string& source,
                                     const std::map<std::string, std::string>& env = {},
                                     const ShellFileReader& read = nullptr);

/// Where the script runs, as far as the import can say.
struct ShellContext {
  std::string script_path;    // $0 and ${BASH_SOURCE[0]}: the script as named on the command line
  std::string cwd;            // $PWD and `pwd`: the folder it runs in (absolute); empty: unknown
  bool assume_files = false;  // file tests hold (the launch machine's files exist) instead of looking in cwd
};

/// What running a script gave besides its words.
struct ShellRun {
  std::vector<std::string> words;
  std::vector<std::string> notes;  // sources skipped, file tests answered, `bash -c` strings run
  std::string exit_where;          // "launch.sh:12:5" of the `exit` (or top-level `return`) that stopped it; empty: ran to the end
  std::string exit_command;        // "exit 1"
  int exit_status = 0;
};

/// shell_words with a context: `$0`, `${BASH_SOURCE[0]}`, `$PWD`, and the command substitutions
/// `$(pwd)`, `` `pwd` ``, `$(dirname X)`, `$(basename X)`, `$(realpath X)`, `$(readlink -f X)`
/// and `$(cd X && pwd)` are known; file tests look at the files (relative to `cwd`) or, with
/// `assume_files`, hold; `bash -c STRING` / `sh -c STRING` (also after srun, mpirun, …) runs the
/// string; a `source`d file whose name is unknown or that cannot be read is skipped with a note.
ShellRun run_shell(const std::string& script, const std::string& source, const std::map<std::string, std::string>& env,
                   const ShellFileReader& read, const ShellContext& context);

}  // namespace ptdp
