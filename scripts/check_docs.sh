#!/usr/bin/env bash
# Checks that the docs name what the code has (issue 19, "docs that say what the code does not"):
#   1. every config key in docs/operators.md's key table is one the server's config parser knows,
#      and every key the parser knows is in that table;
#   2. every `backplane <command>` the README mentions is a subcommand of the CLI, and every flag
#      in such a span is one that command (or the top level) declares;
#   3. every log line the docs quote is one the code can write, at the level quoted (issue 45).
# It reads sources only, so it needs no build. Run from anywhere:
#   scripts/check_docs.sh            exit 0: all agree; 1: a mismatch (each printed); 2: a file
#                                    or pattern it relies on is gone (the check itself is stale)
# ctest runs it as DocsTest.ConfigKeysCommandsAndLogLinesMatchTheCode.
set -euo pipefail

# The sources the docs are checked against, one variable each.
CONFIG_SOURCE=server/config/server_config.cpp  # the config parser's key table
CLI_SOURCE=server/cli/main.cpp              # the CLI11 subcommands and their flags
OPERATORS_DOC=docs/operators.md
README=README.md
# Where the product logs from (tests and benches are not quoted), and where the docs are.
LOG_SOURCE_DIRS=(core loader watcher scheduler registry runtime backends server isolation onnx examples)
DOCS_DIR=docs

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
for file in "$CONFIG_SOURCE" "$CLI_SOURCE" "$OPERATORS_DOC" "$README"; do
  if [[ ! -f $file ]]; then
    echo "check_docs: $file not found (moved? update the variable at the top of $0)" >&2
    exit 2
  fi
done
for dir in "${LOG_SOURCE_DIRS[@]}" "$DOCS_DIR"; do
  if [[ ! -d $dir ]]; then
    echo "check_docs: directory $dir not found (moved? update the variable at the top of $0)" >&2
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

# --- 3. Quoted log lines -------------------------------------------------------------------------
# What counts as a quoted log line (the forms the docs use; a quote in another form is not seen,
# e.g. a line named in prose such as "the log has `backend file … rejected: REASON`"):
#  - a line in a fenced block that looks like spdlog's output,
#    `[2026-12-07 01:32:51.032] [backplane.registry] [info] text` (or `[…]` for the time): real
#    output, its values written out; a `…` in it stands for text left out;
#  - an inline code span `[backplane.module] [level] text` (it may wrap over lines), the same;
#  - a row of a table of lines to grep for, `| `backplane.module` | level(s) | `line` / `part`
#    | ... |`: a word in capitals (P, N, ID, REASON) is a value, `...` text left out; the first
#    quote of the cell is a whole line, the others may be parts of one.
# What it is checked against: the text of every call in the product's sources that logs or
# formats a line — a logger's info/warn/error/debug/trace/critical("format", ...), log(level,
# "format", ...), fmt::format("format", ...) (the registry formats its event lines first and
# logs them after its locks are released) and the HTTP server's LogAtMostEverySecond(text). In a
# format, `{}` (any `{...}`) is a wildcard, or the argument's own text where that argument is a
# literal or a choice between literals (`a ? "x" : "y"`); in text built with `+`, whatever is not
# a literal is a wildcard. A quote passes when some such pattern writes it: a wildcard of the
# code takes any text of the quote; the quote's values and elisions take only what a wildcard of
# the code took, never the code's own words (so an elision cannot hide a changed word), except
# that a quote ending in an elision may stop anywhere. Its level must be the one quoted wherever
# the call says its level (fmt::format's and LogAtMostEverySecond's do not).
# What it cannot check, so does not pretend to:
#  - the text that fills a wildcard: a path, an id, a Status message logged with "{}" (a part of a
#    table row that is such a message passes when its text is in some string literal, wherever
#    that is logged), and a line logged whole as "{}" of a string built elsewhere;
#  - the logger's name (`[backplane.registry]`): lines are matched on their text and level;
#  - a quote that ends in an elision is anchored at its start only, so a format with an early
#    wildcard can take it (some 6-character stretch of the format's own text must be in it, and
#    in a table row its longest stretch of text must be the code's);
#  - output that is not a log line (`backplane check`'s stages, a program's own prints).
log_sources=$(mktemp)
trap 'rm -f "$log_sources"' EXIT
find "${LOG_SOURCE_DIRS[@]}" -type f \( -name '*.cpp' -o -name '*.hpp' -o -name '*.h' \) | sort >"$log_sources"
docs=("$README" "$DOCS_DIR"/*.md)
set +e
log_report=$(python3 - "$log_sources" "${docs[@]}" <<'PY'
# The third check of scripts/check_docs.sh (see there): quoted log lines against the code's
# format strings. Arguments: a file listing the sources, then the docs.
import functools
import itertools
import re
import sys

STAR = None  # a wildcard; a pattern is a tuple of characters and STARs
PLACE = object()  # a format string's placeholder, until fill() puts its argument there


def compress(items):
    out = []
    for item in items:
        if not (item is STAR and out and out[-1] is STAR):
            out.append(item)
    return tuple(out)


# --- the code's format strings ----------------------------------------------------------------
LEVEL_OF = {"trace": "trace", "debug": "debug", "info": "info", "warn": "warning",
            "error": "error", "critical": "critical"}
# Calls whose first argument is a log line or a format string: a logger's level methods,
# logger.log(level, format, ...), fmt::format (the registry formats its event lines first and
# logs them later), and the HTTP server's rate-limited LogAtMostEverySecond(text).
CALLS = set(LEVEL_OF) | {"log", "format", "LogAtMostEverySecond"}
TOKEN = re.compile(r'''
    (?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^()\\ ]{0,16})\((?P<rawtext>.*?)\)(?P=delim)")
  | (?P<str>(?:u8|u|U|L)?"(?P<text>(?:[^"\\\n]|\\.)*)")
  | (?P<chr>'(?:[^'\\\n]|\\.)*')
  | (?P<skip>//[^\n]*|/\*.*?\*/|\s+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>.)
''', re.S | re.X)
ESCAPES = {"n": "\n", "t": "\t", '"': '"', "'": "'", "\\": "\\", "?": "?", "0": "\0"}
OPEN, CLOSE = "([{", ")]}"


def tokens_of(source):
    """(kind, value, line) for each token; comments and spaces dropped."""
    line = 1
    for m in TOKEN.finditer(source):
        text = m.group(0)
        if m.group("raw") is not None:
            yield ("str", m.group("rawtext"), line)
        elif m.group("str") is not None:
            unescaped = re.sub(r"\\(.)", lambda e: ESCAPES.get(e.group(1), e.group(1)),
                               m.group("text"))
            yield ("str", unescaped, line)
        elif m.group("ident") is not None:
            yield ("ident", text, line)
        elif m.group("skip") is None:
            yield ("other" if m.group("chr") else "punct", text, line)
        line += text.count("\n")


def split_arguments(tokens, start):
    """The arguments of the call whose '(' is just before `start`: lists of (kind, value)."""
    arguments, current, depth = [], [], 0
    for kind, value in tokens[start:]:
        if kind == "punct" and value in OPEN:
            depth += 1
        elif kind == "punct" and value in CLOSE:
            if depth == 0:
                arguments.append(current)
                return arguments
            depth -= 1
        elif kind == "punct" and value == "," and depth == 0:
            arguments.append(current)
            current = []
            continue
        current.append((kind, value))
    return arguments


def top_level(tokens, wanted):
    depth = 0
    for i, (kind, value) in enumerate(tokens):
        if kind == "punct" and value in OPEN:
            depth += 1
        elif kind == "punct" and value in CLOSE:
            depth -= 1
        elif kind == "punct" and value == wanted and depth == 0:
            return i
    return -1


def texts_of(expression, formatted=False):
    """The texts an expression can be, as patterns: literals as text, anything else (a
    variable, a call) as a wildcard, `c ? a : b` as both branches. Empty: not text we know."""
    question = top_level(expression, "?")
    if question >= 0:
        rest = expression[question + 1:]
        colon = top_level(rest, ":")
        if colon < 0:
            return []
        return texts_of(rest[:colon], formatted) + texts_of(rest[colon + 1:], formatted)
    if not any(kind == "str" for kind, _ in expression):
        return []
    out, depth = [], 0
    for kind, value in expression:
        if kind == "punct" and value in OPEN:
            depth += 1
        elif kind == "punct" and value in CLOSE:
            depth -= 1
        elif depth == 0 and kind == "str":
            out += pattern_of_literal(value, formatted)
        elif depth == 0 and kind == "punct" and value == "+":
            continue
        else:
            out.append(STAR)  # a variable, or a call's name and arguments
    return [compress(out)]


def pattern_of_literal(text, formatted):
    """A format string's text: `{}` and `{:spec}` are wildcards, `{{` and `}}` braces."""
    if not formatted:
        return list(text)
    out, i = [], 0
    while i < len(text):
        if text.startswith("{{", i) or text.startswith("}}", i):
            out.append(text[i])
            i += 2
        elif text[i] == "{" and "}" in text[i:]:
            out.append(PLACE)
            i = text.index("}", i) + 1
        else:
            out.append(text[i])
            i += 1
    return out


def fill(format_pattern, argument_texts):
    """The format's wildcards replaced, in order, by what each argument can be."""
    choices = []
    for texts in argument_texts:
        choices.append(texts or [(STAR,)])
    products = itertools.islice(itertools.product(*choices), 64) if choices else [()]
    for chosen in products:
        out, next_argument = [], 0
        for item in format_pattern:
            if item is PLACE and next_argument < len(chosen):
                out += chosen[next_argument]
                next_argument += 1
            else:
                out.append(STAR if item is PLACE else item)
        yield compress(out)


def code_formats(files):
    """(pattern, level or None, "file:line") for every log line and format string, and the text
    of every string literal."""
    formats, literals = set(), set()
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as source:
            located = list(tokens_of(source.read()))
        tokens = [(kind, value) for kind, value, _ in located]
        literals.update(value for kind, value in tokens if kind == "str")
        for i in range(len(tokens) - 1):
            kind, value = tokens[i]
            if kind != "ident" or value not in CALLS or tokens[i + 1] != ("punct", "("):
                continue
            arguments = split_arguments(tokens, i + 2)
            if value == "log":  # logger.log(level, format, ...)
                arguments = arguments[1:]
            if not arguments:
                continue
            formatted = value != "LogAtMostEverySecond"
            for text in texts_of(arguments[0], formatted):
                if sum(1 for c in text if isinstance(c, str)) < 6:
                    continue  # "{}", "{}: {}": says nothing a quote could be checked against
                rest = [texts_of(argument) for argument in arguments[1:]] if formatted else []
                for pattern in fill(text, rest):
                    formats.add((pattern, LEVEL_OF.get(value), f"{path}:{located[i][2]}"))
    return sorted(formats, key=lambda f: f[2]), literals


# --- a quote against a format ---------------------------------------------------------------
class Word:
    """A placeholder in a table row (P, N, ID, REASON): a value the code fills in, or the same
    word written by the code itself ("API")."""

    def __init__(self, text):
        self.text = text


def writes(format_pattern, quote, part=False):
    """Whether the format can write the quote (with `part`: a stretch of a line it writes). A
    wildcard of the format takes any text, including the quote's elisions and placeholders; an
    elision inside the quote takes no text of the format's own, only what a wildcard of the
    format took (else a quote that elides anything would match any format sharing its first
    word). A quote that ends with an elision may stop anywhere in the line."""
    prefix = bool(quote) and quote[-1] is STAR
    if prefix:
        quote = quote[:-1]
    shown = "".join(c.text if isinstance(c, Word) else c for c in quote if c is not STAR)
    stretches = runs(format_pattern)
    if part or (prefix and any(isinstance(c, Word) for c in quote)):
        # An end is not anchored, in a quote that writes its values as placeholders (a table
        # row): its longest stretch of text must be text the format writes itself, or a format
        # with a wildcard would take any part and any quote that stops early.
        if not any(longest_stretch(quote) in stretch for stretch in stretches):
            return False
    elif prefix:
        # The end is not anchored: some stretch the format writes itself (of 6 characters, if it
        # has one) must be in the quote, or a format that begins with a wildcard ("{} threw: {}")
        # would take any quote that stops early.
        least = min(6, max(len(stretch) for stretch in stretches))
        if not any(len(stretch) >= least and stretch in shown for stretch in stretches):
            return False
    elif any(stretch not in shown for stretch in stretches):
        return False  # a quick refusal: what the format writes itself must be in the quote

    @functools.lru_cache(maxsize=None)
    def go(i, j):
        if j == len(quote):
            return part or prefix or all(c is STAR for c in format_pattern[i:])
        if i < len(format_pattern) and format_pattern[i] is STAR:
            return go(i + 1, j) or go(i, j + 1)
        if quote[j] is STAR:
            return go(i, j + 1)
        if isinstance(quote[j], Word):
            word = quote[j].text
            return (format_pattern[i:i + len(word)] == tuple(word)) and go(i + len(word), j + 1)
        return i < len(format_pattern) and format_pattern[i] == quote[j] and go(i + 1, j + 1)

    starts = range(len(format_pattern)) if part else [0]
    return any(go(i, 0) for i in starts)


def longest_stretch(quote):
    """The longest run of a quote's own characters (no placeholder, no elision)."""
    stretches = "".join(c if isinstance(c, str) else "\0" for c in quote).split("\0")
    return max(stretches, key=len)


def runs(pattern):
    """The literal stretches of a pattern."""
    out, run = [], []
    for item in pattern + (STAR,):
        if item is STAR:
            if run:
                out.append("".join(run))
            run = []
        else:
            run.append(item)
    return out


# --- the docs' quoted log lines ---------------------------------------------------------------
LEVELS = r"(trace|debug|info|warning|error|critical)"
LINE = re.compile(r"^\s*\[(?:…|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\] \[(backplane[a-z_.]*)\] \["
                  + LEVELS + r"\] (.*)$")
INLINE = re.compile(r"`\[(backplane[a-z_.]*)\] \[" + LEVELS + r"\] ([^`]*)`")
# A row of a table of lines to grep for: | `backplane.module` | level(s) | `line` / `more` | ... |,
# with a word in capitals where a value goes (P, N, ID, REASON) and `...` for text left out.
# The first quote of the cell is a whole line, the others may be parts of one ("`backend path P
# dropped: it does not exist` / `it is not a directory`").
TABLE = re.compile(r"^\|\s*`(backplane(?:\.[a-z_]+)*)`\s*\|\s*([a-z /]+?)\s*\|\s*(.*?)\s*\|")
PLACEHOLDER = re.compile(r"(\.\.\.|…|\b[A-Z][A-Z0-9_]*\b)")


def doc_quotes(docs):
    """("file:line", levels, pattern, is a part, text) for each quoted log line."""
    quotes = []
    for path in docs:
        with open(path, encoding="utf-8") as doc:
            text = doc.read()
        fenced = False
        for number, line in enumerate(text.split("\n"), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif fenced and (m := LINE.match(line)):
                message = m.group(3).rstrip()
                quotes.append((f"{path}:{number}", {m.group(2)}, elided(message), False, message))
            elif not fenced and (m := TABLE.match(line)):
                levels = {level.strip() for level in m.group(2).split("/")}
                for i, quoted in enumerate(re.findall(r"`([^`]*)`", m.group(3))):
                    pattern = []
                    for piece in PLACEHOLDER.split(quoted):
                        if piece in ("...", "…"):
                            pattern.append(STAR)
                        elif PLACEHOLDER.fullmatch(piece):
                            pattern.append(Word(piece))
                        else:
                            pattern += piece
                    quotes.append((f"{path}:{number}", levels, tuple(pattern), i > 0, quoted))
        for m in INLINE.finditer(text):
            number = text.count("\n", 0, m.start()) + 1
            message = re.sub(r"\s*\n\s*", " ", m.group(3))
            quotes.append((f"{path}:{number}", {m.group(2)}, elided(message), False, message))
    return quotes


def elided(message):
    return compress(STAR if c == "…" else c for c in message)


def main():
    sys.setrecursionlimit(100000)
    with open(sys.argv[1]) as listing:
        files = [line for line in listing.read().split("\n") if line]
    formats, literals = code_formats(files)
    quotes = doc_quotes(sys.argv[2:])
    if not formats:
        print("check_docs: found no log format strings in the sources (has the way the code "
              "logs changed?)", file=sys.stderr)
        return 2
    if not quotes:
        print("check_docs: found no quoted log lines in the docs (has their form changed?)",
              file=sys.stderr)
        return 2
    failures = 0
    for where, levels, quote, part, message in quotes:
        level = " / ".join(sorted(levels))
        matches = [(code_level, site) for pattern, code_level, site in formats
                   if writes(pattern, quote, part)]
        if not matches and part and any(longest_stretch(quote) in text for text in literals):
            # A part of a line that is text the code builds elsewhere (a Status message logged
            # with "{}"): the text exists; where it is logged, and at what level, is not checked.
            continue
        if not matches:
            print(f"check_docs: {where}: no log format string in the code writes "
                  f"'[{level}] {message}'")
            failures += 1
        elif all(code_level is not None and code_level not in levels
                 for code_level, _ in matches):
            sites = ", ".join(sorted({f"{site} ({code_level})" for code_level, site in matches}))
            print(f"check_docs: {where}: quoted at [{level}], but the code logs it at another "
                  f"level: {sites}")
            failures += 1
    print(f"{len(quotes)} {failures}")
    return 1 if failures else 0


sys.exit(main())
PY
)
log_status=$?
set -e
if ((log_status == 2)); then
  exit 2
fi
# The last line is the summary: "<quotes> <mismatches>"; the lines before it, the mismatches.
read -r quoted log_failures <<<"$(tail -n 1 <<<"$log_report")"
if ((log_failures > 0)); then
  head -n -1 <<<"$log_report"
  failures=$((failures + log_failures))
elif ((log_status != 0)); then
  echo "check_docs: the log line check failed ($log_status): $log_report" >&2
  exit 2
fi

if ((failures > 0)); then
  echo "check_docs: $failures mismatch(es)"
  exit 1
fi
echo "check_docs: $(wc -l <<<"$parser_keys") config keys, $mentioned README command mention(s) and $quoted quoted log line(s) agree with the code"
