#!/usr/bin/env bash
# Checks that the docs name what the code has (issue 19, "docs that say what the code does not"):
#   1. every config key in docs/operators.md's key table is one the server's config parser knows,
#      and every key the parser knows is in that table;
#   2. every `backplane <command>` the README mentions is a subcommand of the CLI, and every flag
#      in such a span is one that command (or the top level) declares.
# It reads sources only, so it needs no build. Run from anywhere:
#   scripts/check_docs.sh            exit 0: all agree; 1: a mismatch (each printed); 2: a file
#                                    or pattern it relies on is gone (the check itself is stale)
# Not wired into the tests yet.
set -euo pipefail

# The sources the docs are checked against, one variable each.
CONFIG_SOURCE=server/config/server_config.cpp  # the config parser's key table
CLI_SOURCE=server/cli/main.cpp              # the CLI11 subcommands and their flags
OPERATORS_DOC=docs/operators.md
README=README.md

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
for file in "$CONFIG_SOURCE" "$CLI_SOURCE" "$OPERATORS_DOC" "$README"; do
  if [[ ! -f $file ]]; then
    echo "check_docs: $file not found (moved? update the variable at the top of $0)" >&2
    exit 2
  fi
done

failures=0
fail() {
  echo "check_docs: $*"
  failures=$((failures + 1))
}

# --- 1. Config keys -----------------------------------------------------------------------------
# The parser's table: entries are `{"key", ...}` or `IntegerKey("key", ...)` / `StringKey(...)` /
# `DurationKey(...)`, each at the start of a line.
parser_keys=$(grep -oE '^[[:space:]]*(\{|[A-Z][A-Za-z]*Key\()"[a-z_]+"' "$CONFIG_SOURCE" |
  grep -oE '"[a-z_]+"' | tr -d '"' | sort -u)
# The doc's table: the rows under the header `| key | flag | default | meaning |`, up to the first
# line that is not a table row.
doc_keys=$(awk '
  /^\| key \| flag \| default \| meaning \|/ { in_table = 1; next }
  in_table && !/^\|/ { exit }
  in_table && /^\| `/ { split($0, cells, "`"); print cells[2] }
' "$OPERATORS_DOC" | sort -u)

if [[ -z $parser_keys ]]; then
  echo "check_docs: no config keys found in $CONFIG_SOURCE (has the key table's form changed?)" >&2
  exit 2
fi
if [[ -z $doc_keys ]]; then
  echo "check_docs: no '| key | flag | default | meaning |' table in $OPERATORS_DOC" >&2
  exit 2
fi
while read -r key; do
  fail "config key '$key' is in $OPERATORS_DOC but not in $CONFIG_SOURCE's parser"
done < <(comm -23 <(echo "$doc_keys") <(echo "$parser_keys"))
while read -r key; do
  fail "config key '$key' is parsed by $CONFIG_SOURCE but not documented in $OPERATORS_DOC"
done < <(comm -13 <(echo "$doc_keys") <(echo "$parser_keys"))

# --- 2. README commands and their flags ---------------------------------------------------------
# The CLI as one line, so that a call split over lines still matches.
cli=$(tr '\n' ' ' <"$CLI_SOURCE")
commands=$(grep -oE 'add_subcommand\([[:space:]]*"[a-z-]+"' <<<"$cli" | grep -oE '"[a-z-]+"' |
  tr -d '"' | sort -u)
if [[ -z $commands ]]; then
  echo "check_docs: no add_subcommand(\"...\") in $CLI_SOURCE" >&2
  exit 2
fi
# Flags per command: `<command>_command->add_option("--flag"` (or add_flag); the top level's are
# `app.add_option("--flag"`, valid before any command.
flags_of() {
  local owner=$1
  grep -oE "${owner}(->|\.)add_(option|flag)\([[:space:]]*\"--[a-z-]+\"" <<<"$cli" |
    grep -oE -- '--[a-z-]+' | sort -u
}
top_flags=$(flags_of 'app')

# Every inline-code span that starts with `backplane ` (spans may wrap over lines: the README is
# joined first), and every shell line `$ backplane ...` in a code block.
spans=$(
  {
    # shellcheck disable=SC2016  # the backquotes are Markdown's, not command substitution
    tr '\n' ' ' <"$README" | grep -oE '`(\$ )?([a-z./]*/)?backplane [^`]*`' | tr -d '`' || true
    grep -oE '^\$ ([a-z./]*/)?backplane .*' "$README" || true
  } | sed -E 's/^\$ //; s#^[a-z./]*/backplane #backplane #'
)
mentioned=0
while read -r span; do
  [[ -z $span ]] && continue
  read -ra words <<<"$span"
  # backplane [--log-level LEVEL] COMMAND ...
  i=1
  while [[ ${words[i]:-} == --* ]]; do
    grep -qxF -- "${words[i]}" <<<"$top_flags" || fail "README: '${words[i]}' in '$span' is not a top-level flag"
    i=$((i + 2))
  done
  command=${words[i]:-}
  [[ -z $command ]] && continue
  mentioned=$((mentioned + 1))
  if ! grep -qxF -- "$command" <<<"$commands"; then
    fail "README mentions 'backplane $command', which is not a command (known: $(paste -sd' ' <<<"$commands"))"
    continue
  fi
  command_flags=$(flags_of "${command//-/_}_command")
  for word in "${words[@]:i+1}"; do
    # A flag inside brackets or with a value glued on: [--flag, --flag=VALUE, --flag]...
    flag=$(grep -oE -- '--[a-z][a-z-]*' <<<"$word" | head -n 1 || true)
    [[ -z $flag ]] && continue
    grep -qxF -- "$flag" <<<"$command_flags" || grep -qxF -- "$flag" <<<"$top_flags" ||
      fail "README: 'backplane $command' has no flag '$flag' (in '$span')"
  done
done <<<"$spans"
if ((mentioned == 0)); then
  echo "check_docs: found no 'backplane <command>' in $README (has its form changed?)" >&2
  exit 2
fi

if ((failures > 0)); then
  echo "check_docs: $failures mismatch(es)"
  exit 1
fi
echo "check_docs: $(wc -l <<<"$parser_keys") config keys and $mentioned README command mention(s) agree with the code"
