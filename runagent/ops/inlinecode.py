"""Programs given inline in a command's words (`python3 -c`, `perl -e`, an awk program, a sed
script), and whether what they do to files can be known without running them."""

from __future__ import annotations

import re

from runagent.ops.shellsyntax import Word
from runagent.record import record


@record
class Language:
    """How an interpreter takes a program from its words: the short options whose letter means
    "the program follows" (`-c`, `-e`, glued into `-pe` too), their long spellings, and the
    options that take a value of their own (so `-W ignore -c ...` is not read as a script)."""

    code_letters: str
    code_options: frozenset[str] = frozenset()
    value_letters: str = ""


LANGUAGES: dict[str, Language] = {
    "python": Language("c", value_letters="WXQ"),
    "perl": Language("eE"),
    "ruby": Language("e", value_letters="IrCFE"),
    "node": Language("ep", frozenset({"--eval", "--print"}), value_letters="r"),
    "deno": Language("", frozenset({"eval"})),
    "bun": Language("e", frozenset({"--eval", "--print"})),
    "php": Language("rBRE", value_letters="cdzf"),
    "lua": Language("e", value_letters="l"),
    "fish": Language("c", frozenset({"--command"})),
    "osascript": Language("e"),
    "tclsh": Language(""),
    "julia": Language("eE", frozenset({"--eval", "--print"})),
    "Rscript": Language("e"),
}
# python3.12, perl5.36, nodejs, luajit, pypy3: one interpreter under a versioned name.
_VERSIONED = re.compile(r"(python|pypy|perl|ruby|node|php|lua|luajit|tclsh)(js)?[0-9.]*")
_CANONICAL = {"pypy": "python", "luajit": "lua"}
AWKS = frozenset({"awk", "gawk", "mawk", "nawk", "busybox-awk"})
# awk options that load code or change files (gawk -i inplace, -l ext), and those with a value.
_AWK_LOADS = frozenset({"-i", "--include", "-l", "--load", "-E", "--exec"})
_AWK_VALUES = frozenset({"-F", "-v", "-f", "--file", "--field-separator", "--assign"})
# What in an awk program reaches past its input and stdout: a command run (system, `| getline`,
# `print | "cmd"`), a file written (`print > f`, `printf >> f`), a library loaded (@load).
_AWK_ACTS = re.compile(r"\bsystem\s*\(|(?<!\|)\|(?!\|)|\bprintf?\b[^;{}\n]*>|@(load|include)")


def interpreter(name: str) -> str | None:
    """The interpreter a command name runs (`python3.12` is python), or None for others."""
    if name in LANGUAGES:
        return name
    found = _VERSIONED.fullmatch(name)
    if found is None:
        return None
    base = found.group(1)
    return _CANONICAL.get(base, base)


def has_inline_code(language: Language, words: tuple[Word, ...]) -> bool:
    """Whether the words before the interpreter's first operand give it a program to run."""
    index = 1
    while index < len(words):
        word = words[index]
        if word is None:
            return True  # an option only known at run time could be -c
        if word in language.code_options or word.partition("=")[0] in language.code_options:
            return True
        if word == "--" or not word.startswith("-") or word == "-":
            return False
        if not word.startswith("--"):
            for position, letter in enumerate(word[1:], 1):
                if letter in language.code_letters:
                    return True
                if letter in language.value_letters:
                    index += position == len(word) - 1  # its value is the next word
                    break
        index += 1
    return False


def awk_acts(words: tuple[Word, ...]) -> str | None:
    """Why an awk command can do more than read its input and print (None when it cannot)."""
    index = 1
    program: Word = ""
    from_file = False
    while index < len(words):
        word = words[index]
        if word is None:
            return "an option only known at run time"
        if word == "--":
            index += 1
            break
        if not word.startswith("-") or word == "-":
            break
        option = word.partition("=")[0] if word.startswith("--") else word[:2]
        if option in _AWK_LOADS:
            return f"{word!r} loads code or rewrites files"
        if option in ("-e", "--source"):
            program = _next(words, index, word)
            if program is None or _AWK_ACTS.search(program):
                return "its program runs commands or writes files"
        from_file = from_file or option in ("-f", "--file")
        if option in _AWK_VALUES | {"-e", "--source"} and (word == option):
            index += 1
        index += 1
    if not from_file and program == "":
        program = words[index] if index < len(words) else ""
        if program is None:
            return "its program is only known at run time"
        if _AWK_ACTS.search(program):
            return "its program runs commands or writes files"
    return None


def _next(words: tuple[Word, ...], index: int, word: str) -> Word:
    """The value of the option `word` at `index`: glued on (`-eX`, `--source=X`), else next."""
    if word.startswith("--") and "=" in word:
        return word.partition("=")[2]
    if not word.startswith("--") and len(word) > 2:
        return word[2:]
    return words[index + 1] if index + 1 < len(words) else None


_SED_VALUES = frozenset({"-l", "--line-length"})


def sed_acts(words: tuple[Word, ...]) -> str | None:
    """Why a sed command can write a file or run a command through its script (w, W, e, the
    s command's w and e flags), or None when it cannot; GNU sed's --sandbox forbids both."""
    scripts: list[Word] = []
    operands: list[Word] = []
    from_file = False
    index = 1
    options_end = False
    while index < len(words):
        word = words[index]
        if word is None:
            if options_end or scripts or from_file:
                operands.append(None)
            else:
                return "a word only known at run time could be its script"
        elif options_end or not word.startswith("-") or word == "-":
            operands.append(word)
        elif word == "--":
            options_end = True
        elif word == "--sandbox":
            return None
        elif word.startswith("--"):
            name, equals, value = word.partition("=")
            if name == "--expression":
                scripts.append(value if equals else _next(words, index, word))
                index += 0 if equals else 1
            elif name == "--file":
                from_file = True
                index += 0 if equals else 1
            elif name in _SED_VALUES and not equals:
                index += 1
        else:
            for position, letter in enumerate(word[1:], 1):
                if letter in "ef":
                    rest = word[position + 1 :]
                    index += 0 if rest else 1
                    if letter == "e":
                        scripts.append(rest or (words[index] if index < len(words) else None))
                    else:
                        from_file = True
                    break
                if letter == "l":
                    index += 0 if word[position + 1 :] else 1
                    break
                if letter == "i":
                    break  # -i[SUFFIX]: the rest is the suffix
        index += 1
    if not scripts and not from_file:
        scripts = operands[:1]
    for script in scripts:
        if script is None:
            return "its script is only known at run time"
        if sed_script_acts(script):
            return "its script writes files or runs commands (w, W, e)"
    return None


_SED_SIMPLE = set("{}=dDgGhHnNpPxzF")
_SED_NUMBERED = set("qQlL")
_SED_TO_EOL = set("aicrR#")  # text, a file to read, a comment: the rest of the line
_SED_LABELS = set("btTv:")  # a label ends at `;` too (`:a;N;$!ba`)


def sed_script_acts(script: str) -> bool:
    """Whether a sed script has a command that writes a file or runs one; a script this reader
    cannot follow counts as one that does."""
    at = 0
    end = len(script)
    while at < end:
        char = script[at]
        if char in " \t\n;":
            at += 1
            continue
        at = _sed_address(script, at)
        if at < 0:
            return True
        while at < end and script[at] in " \t!":
            at += 1
        if at >= end:
            return False
        command = script[at]
        if command in "wWe":
            return True
        if command in _SED_SIMPLE:
            at += 1
        elif command in _SED_NUMBERED:
            at += 1
            while at < end and script[at] in " 0123456789":
                at += 1
        elif command in _SED_TO_EOL:
            at = _end_of_text(script, at)
        elif command in _SED_LABELS:
            while at < end and script[at] not in ";\n":
                at += 1
        elif command in "sy":
            if at + 1 >= end or script[at + 1] in "\\\n":
                return True
            at = _sed_part(script, at + 2, script[at + 1])
            at = _sed_part(script, at, script[at - 1]) if at > 0 else at
            if at < 0:
                return True
            if command == "s":
                flags = at
                while at < end and script[at] not in ";\n}":
                    at += 1
                if set(script[flags:at].replace(" ", "")) & set("we"):
                    return True
        else:
            return True
    return False


def _sed_address(script: str, at: int) -> int:
    """Past the address (`1`, `$`, `/re/`, `\\%re%`, `1,+3`, `0~2`, `/a/I`); -1 if unreadable."""
    end = len(script)
    while at < end:
        char = script[at]
        if char in "0123456789$,~+":
            at += 1
        elif char == "/":
            at = _sed_part(script, at + 1, "/")
            if at < 0:
                return -1
            while at < end and script[at] in "IM":
                at += 1
        elif char == "\\" and at + 1 < end:
            at = _sed_part(script, at + 2, script[at + 1])
            if at < 0:
                return -1
        else:
            return at
    return at


def _sed_part(script: str, at: int, delimiter: str) -> int:
    """Past the next unescaped `delimiter` from `at`; -1 when there is none."""
    while at < len(script):
        if script[at] == "\\":
            at += 2
        elif script[at] == delimiter:
            return at + 1
        else:
            at += 1
    return -1


def _end_of_text(script: str, at: int) -> int:
    """Past the end of the line (a label, a file name, text with `\\` continuations)."""
    while at < len(script) and script[at] != "\n":
        at += 2 if script[at] == "\\" else 1
    return at
