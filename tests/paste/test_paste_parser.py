"""The copy-paste protocol's reply parser: every example of the spec, the broken blocks a model
writes, and what chat windows do to text (CRLF, typographic quotes, code fences)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runagent.paste.parser import Command, Problem, parse
from runagent.paste.protocol import Name

# The spec's command examples (spec/copy-paste-protocol.md, "Command Syntax Reference"), as
# written there.
SPEC_EXAMPLES = {
    Name.CREATE_FILE: '[CREATE_FILE path="relative/path"]\nfile contents\n[/CREATE_FILE]',
    Name.EDIT_FILE: (
        '[EDIT_FILE path="relative/path" start_line="N" end_line="M"]\n'
        "replacement content\n[/EDIT_FILE]"
    ),
    Name.DELETE_FILE: '[DELETE_FILE path="relative/path"]',
    Name.READ_FILE: '[READ_FILE path="relative/path"]',
    Name.RUN_COMMAND: "[RUN_COMMAND]\ncommand text\n[/RUN_COMMAND]",
    Name.MESSAGE: "[MESSAGE]\nmessage text\n[/MESSAGE]",
    Name.DONE: "[DONE]\nsummary text\n[/DONE]",
}


def only(text: str) -> Command | Problem:
    items = parse(text)
    assert len(items) == 1, items
    return items[0]


@pytest.mark.parametrize("name", [n for n in SPEC_EXAMPLES if n is not Name.EDIT_FILE])
def test_every_example_of_the_spec_reads_as_its_command(name: Name) -> None:
    item = only(SPEC_EXAMPLES[name])
    assert isinstance(item, Command)
    assert item.name is name
    assert item.line == 1
    if name in (Name.CREATE_FILE, Name.DELETE_FILE, Name.READ_FILE):
        assert item.path == "relative/path"
    bodies = {
        Name.CREATE_FILE: "file contents",
        Name.RUN_COMMAND: "command text",
        Name.MESSAGE: "message text",
        Name.DONE: "summary text",
    }
    assert item.body == bodies.get(name)


def test_the_spec_edit_example_with_its_placeholders_is_an_error_naming_the_value() -> None:
    # The spec writes start_line="N": not a number, which the spec says is an ErrorCommand.
    item = only(SPEC_EXAMPLES[Name.EDIT_FILE])
    assert isinstance(item, Problem)
    assert item.message == "start_line='N' is not a line number (a whole number from 1)"


def test_an_edit_with_numbers_reads_its_range_and_body_verbatim() -> None:
    text = (
        '[EDIT_FILE path="src/a.py" start_line="3" end_line="4"]\n'
        "    return 1\n\tx = 2\n[/EDIT_FILE]"
    )
    item = only(text)
    assert isinstance(item, Command)
    assert (item.number("start_line"), item.number("end_line")) == (3, 4)
    assert item.body == "    return 1\n\tx = 2"


def test_several_commands_run_in_order_and_text_between_them_is_ignored() -> None:
    reply = (
        "I'll start by creating the project.\n\n"
        '[CREATE_FILE path="src/Calculator.cs"]\npublic class Calculator\n{\n}\n[/CREATE_FILE]\n'
        "Now let's build it:\n"
        "[RUN_COMMAND]\ndotnet build\n[/RUN_COMMAND]\n"
        '[READ_FILE path="src/Program.cs"]\n'
        "Some [bracketed] text and a [link](http://x) and [x] a checklist.\n"
        "[MESSAGE]\nBuilt.\n[/MESSAGE]\n"
    )
    items = parse(reply)
    assert [getattr(i, "name", None) for i in items] == [
        Name.CREATE_FILE, Name.RUN_COMMAND, Name.READ_FILE, Name.MESSAGE,
    ]  # fmt: skip
    assert all(isinstance(i, Command) for i in items)
    assert items[0].body == "public class Calculator\n{\n}"  # type: ignore[union-attr]
    assert [i.line for i in items] == [3, 9, 12, 14]


def test_indentation_and_blank_lines_of_a_body_are_kept() -> None:
    body = "def f():\n\n    if x:\n        return  1   \n"
    item = only(f'[CREATE_FILE path="f.py"]\n{body}[/CREATE_FILE]')
    assert isinstance(item, Command)
    assert item.body == body.rstrip("\n")


def test_tags_inside_a_body_are_content_until_the_exact_closing_tag() -> None:
    reply = (
        '[CREATE_FILE path="docs/protocol.md"]\n'
        "Write [RUN_COMMAND] blocks like this:\n"
        '    [DELETE_FILE path="x"]\n'
        "[/RUN_COMMAND]\n"
        "  [/CREATE_FILE] with more on its line is content too\n"
        "[/CREATE_FILE]\n"
    )
    (first,) = parse(reply)
    assert isinstance(first, Command)
    assert (
        first.body == 'Write [RUN_COMMAND] blocks like this:\n    [DELETE_FILE path="x"]\n'
        "[/RUN_COMMAND]\n  [/CREATE_FILE] with more on its line is content too"
    )


def test_an_indented_closing_tag_closes_its_block() -> None:
    item = only('  [CREATE_FILE path="a"]\nx\n   [/CREATE_FILE]   ')
    assert isinstance(item, Command)
    assert item.body == "x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[CREATE_FILE]\nx\n[/CREATE_FILE]", '[CREATE_FILE] has no path="..." attribute'),
        ('[CREATE_FILE path=""]\nx\n[/CREATE_FILE]', '[CREATE_FILE] has no path="..." attribute'),
        ("[DELETE_FILE]", '[DELETE_FILE] has no path="..." attribute'),
        ('[READ_FILE name="a"]', '[READ_FILE] has no path="..." attribute'),
        (
            '[EDIT_FILE path="a" start_line="1"]\nx\n[/EDIT_FILE]',
            '[EDIT_FILE] has no end_line="..." attribute',
        ),
        (
            '[EDIT_FILE path="a" start_line="two" end_line="3"]\nx\n[/EDIT_FILE]',
            "start_line='two' is not a line number (a whole number from 1)",
        ),
        (
            '[EDIT_FILE path="a" start_line="0" end_line="3"]\nx\n[/EDIT_FILE]',
            "start_line='0' is not a line number (a whole number from 1)",
        ),
        (
            '[EDIT_FILE path="a" start_line="-1" end_line="3"]\nx\n[/EDIT_FILE]',
            "start_line='-1' is not a line number (a whole number from 1)",
        ),
        (
            '[EDIT_FILE path="a" start_line="1.5" end_line="3"]\nx\n[/EDIT_FILE]',
            "start_line='1.5' is not a line number (a whole number from 1)",
        ),
        (
            '[EDIT_FILE path="a" start_line="\uff15" end_line="6"]\nx\n[/EDIT_FILE]',
            "start_line='\uff15' is not a line number (a whole number from 1)",
        ),
        (
            '[EDIT_FILE path="a" start_line="5" end_line="2"]\nx\n[/EDIT_FILE]',
            "end_line 2 is before start_line 5",
        ),
        (
            '[CREATE_FILE path="a"]\nx\ny',
            '[CREATE_FILE path="a"] is not closed: no [/CREATE_FILE] line follows it; nothing '
            "after it was carried out",
        ),
        (
            "[RUN_COMMAND]\nls",
            "[RUN_COMMAND] is not closed: no [/RUN_COMMAND] line follows it; nothing after it "
            "was carried out",
        ),
        ('[WRITE_FILE path="a"]', "unknown command [WRITE_FILE]"),
        ("[SHELL]", "unknown command [SHELL]"),
        ("[/MESSAGE]", "[/MESSAGE] closes a block that was not opened"),
    ],
)
def test_a_broken_block_is_a_problem_that_says_what_is_wrong(text: str, message: str) -> None:
    item = only(text)
    assert isinstance(item, Problem), item
    assert item.message == message
    assert item.line == 1


def test_nothing_after_an_unclosed_block_is_read_as_commands() -> None:
    # A file's text that holds command blocks must not run because its closing tag was mangled.
    reply = (
        '[CREATE_FILE path="README.md"]\nRun it like this:\n[RUN_COMMAND]\n'
        "echo executed-from-file-content > pwned.txt\n[/RUN_COMMAND]\n[/CREATE_FILE].\n"
    )
    (only_item,) = parse(reply)
    assert isinstance(only_item, Problem) and "not closed" in only_item.message


def test_a_closing_tag_with_a_fence_after_it_closes_its_block() -> None:
    item = only('[CREATE_FILE path="a.txt"]\nx\n[/CREATE_FILE]```')
    assert isinstance(item, Command) and item.body == "x"


def test_a_body_of_one_empty_line_is_one_line() -> None:
    one = only('[EDIT_FILE path="a" start_line="2" end_line="2"]\n\n[/EDIT_FILE]')
    none = only('[EDIT_FILE path="a" start_line="2" end_line="2"]\n[/EDIT_FILE]')
    assert isinstance(one, Command) and one.lines == ("",)
    assert isinstance(none, Command) and none.lines == ()


def test_a_line_number_of_thousands_of_digits_is_a_problem_not_a_crash() -> None:
    nines = "9" * 5000
    item = only(f'[EDIT_FILE path="a" start_line="{nines}" end_line="{nines}"]\nx\n[/EDIT_FILE]')
    assert isinstance(item, Problem) and "is not a line number" in item.message


def test_an_apostrophe_inside_a_double_quoted_value_is_part_of_it() -> None:
    assert only('[READ_FILE path="don\'t.txt"]').path == "don't.txt"  # type: ignore[union-attr]
    assert only("[READ_FILE path='say \"hi\".txt']").path == 'say "hi".txt'  # type: ignore[union-attr]


def test_a_line_of_many_brackets_is_read_in_one_pass() -> None:
    # Quadratic scanning made this take minutes; read once, it is nothing at all.
    (item,) = parse('[MESSAGE "' + "]" * 200_000 + "\nhi\n[/MESSAGE]")
    assert isinstance(item, Command) and item.body == "hi"
    (broken,) = parse('[MESSAGE "' + "]" * 200_000)
    assert isinstance(broken, Problem) and len(broken.message) < 300


def test_crlf_and_lone_cr_line_ends_and_a_bom_read_as_unix_lines() -> None:
    reply = (
        '\ufeff[CREATE_FILE path="a.txt"]\r\none\r\ntwo\r\n[/CREATE_FILE]\r\n[DONE]\rok\r[/DONE]'
    )
    create, done = parse(reply)
    assert isinstance(create, Command) and create.body == "one\ntwo"
    assert isinstance(done, Command) and done.body == "ok"


@pytest.mark.parametrize(
    "quoted",
    [
        "\u201csrc/a.py\u201d",
        "\u201esrc/a.py\u201c",
        "'src/a.py'",
        "\u2018src/a.py\u2019",
        "src/a.py",
    ],
)
def test_typographic_single_or_no_quotes_around_a_value_are_read(quoted: str) -> None:
    item = only(f"[READ_FILE path={quoted}]")
    assert isinstance(item, Command) and item.path == "src/a.py"


def test_attribute_spellings_a_model_uses_are_read_as_the_spec_names() -> None:
    item = only('[EDIT_FILE path="a" startLine="2" end-line="3"]\nx\n[/EDIT_FILE]')
    assert isinstance(item, Command)
    assert (item.number("start_line"), item.number("end_line")) == (2, 3)


def test_a_path_with_brackets_and_spaces_in_quotes_is_read_whole() -> None:
    item = only('[CREATE_FILE path="docs/a [draft] b.md"]\nx\n[/CREATE_FILE]')
    assert isinstance(item, Command) and item.path == "docs/a [draft] b.md"


def test_a_reply_wrapped_in_a_code_fence_reads_the_same() -> None:
    plain = '[CREATE_FILE path="a.txt"]\nx\n[/CREATE_FILE]\n[RUN_COMMAND]\nls\n[/RUN_COMMAND]'
    fenced = f"Here you go:\n```text\n{plain}\n```\n"
    assert [(i.name, i.body) for i in parse(fenced)] == [(i.name, i.body) for i in parse(plain)]  # type: ignore[union-attr]


def test_each_block_in_its_own_fence_reads_the_same() -> None:
    reply = (
        '```\n[CREATE_FILE path="a.txt"]\nx\n[/CREATE_FILE]\n```\n'
        "and then\n```bash\n[RUN_COMMAND]\nls\n[/RUN_COMMAND]\n```\n"
    )
    items = parse(reply)
    assert [(i.name, i.body) for i in items] == [(Name.CREATE_FILE, "x"), (Name.RUN_COMMAND, "ls")]  # type: ignore[union-attr]


def test_a_fence_inside_a_body_is_content() -> None:
    body = "# Title\n\n```python\nprint(1)\n```"
    item = only(f'[CREATE_FILE path="README.md"]\n{body}\n[/CREATE_FILE]')
    assert isinstance(item, Command) and item.body == body


def test_a_closing_tag_after_a_self_closing_command_belongs_to_it() -> None:
    items = parse('[READ_FILE path="a"]\n\n[/READ_FILE]\n[DELETE_FILE path="b" /]\n[/DELETE_FILE]')
    assert [(i.name, i.path) for i in items] == [(Name.READ_FILE, "a"), (Name.DELETE_FILE, "b")]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "line", ['[DELETE_FILE path="x"] <- like this', '[READ_FILE path="x"] and then edit it']
)
def test_a_self_closing_tag_with_text_after_it_on_its_line_is_not_a_command(line: str) -> None:
    item = only(f"Write it like this:\n{line}\n")
    assert isinstance(item, Problem)
    assert "has text after its tag" in item.message and "not carried out" in item.message


@pytest.mark.parametrize("after", ["", "  ", "[/READ_FILE]", " [/READ_FILE]", "```", " ``` "])
def test_a_self_closing_tag_followed_only_by_its_closing_tag_or_a_fence_is_read(
    after: str,
) -> None:
    item = only(f'[READ_FILE path="a"]{after}')
    assert isinstance(item, Command) and item.path == "a"


@pytest.mark.parametrize(
    ("tag", "named"),
    [
        ('[DELETE_FILE path="a" path="b"]', 'path 2 times (path="a", path="b")'),
        ('[READ_FILE path="a" path="a"]', 'path 2 times (path="a", path="a")'),
        (
            '[EDIT_FILE path="f" start_line="1" startLine="5" end_line="5"]\nx\n[/EDIT_FILE]',
            'start_line 2 times (start_line="1", start_line="5")',
        ),
    ],
)
def test_an_attribute_given_twice_is_a_problem_naming_it(tag: str, named: str) -> None:
    item = only(tag)
    assert isinstance(item, Problem) and named in item.message, item


def test_an_attribute_given_twice_in_a_block_still_ends_at_its_closing_tag() -> None:
    items = parse(
        '[CREATE_FILE path="a" path="b"]\n[DELETE_FILE path="c"]\n[/CREATE_FILE]\n'
        "[MESSAGE]\nnext\n[/MESSAGE]"
    )
    assert isinstance(items[0], Problem)
    assert [getattr(i, "name", None) for i in items[1:]] == [Name.MESSAGE]


def test_a_block_on_one_line_is_read() -> None:
    item = only("[MESSAGE]All done here.[/MESSAGE]")
    assert isinstance(item, Command) and item.body == "All done here."


def test_an_empty_body_is_empty() -> None:
    item = only('[CREATE_FILE path="empty.txt"]\n[/CREATE_FILE]')
    assert isinstance(item, Command) and item.body == ""


def test_a_reply_with_no_commands_has_no_items() -> None:
    assert parse("I think you should refactor this. [Note] see [1].\n- [x] done\n") == []


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(),
            st.sampled_from(
                [
                    '[CREATE_FILE path="a"]',
                    "[/CREATE_FILE]",
                    "[RUN_COMMAND]",
                    "[/RUN_COMMAND]",
                    '[EDIT_FILE path="a" start_line="1" end_line="x"]',
                    "[/EDIT_FILE]",
                    "[DONE]",
                    "[",
                    "]",
                    '"',
                    "\u201c",
                    "```",
                    "\r\n",
                    "\r",
                    "\ufeff",
                    "[READ_FILE path=",
                    "[MESSAGE]x[/MESSAGE]",
                    "[DELETE_FILE /]",
                    "[A_B]",
                    "[/",
                    "=",
                    "\x00",
                ]
            ),
        ),
        max_size=30,
    )
)
def test_no_text_makes_the_parser_raise(parts: list[str]) -> None:
    items = parse("".join(parts))
    for item in items:
        assert isinstance(item, Command | Problem)
        if isinstance(item, Command) and item.name is Name.EDIT_FILE:
            assert 1 <= item.number("start_line") <= item.number("end_line")


def test_a_tag_with_a_very_long_attribute_text_is_read_in_one_pass() -> None:
    item = only('[CREATE_FILE path="x" ' + "a" * 200_000 + "]\nx\n[/CREATE_FILE]")
    assert isinstance(item, Command) and item.path == "x"


@pytest.mark.parametrize("after", ["```", " ```", "``` python", "```python"])
def test_a_closing_tag_with_any_fence_after_it_closes_its_block(after: str) -> None:
    item = only(f'[CREATE_FILE path="a.txt"]\nx\n[/CREATE_FILE]{after}')
    assert isinstance(item, Command) and item.body == "x"


def test_a_tag_with_text_after_it_is_no_command_unless_a_closing_tag_follows() -> None:
    # `[DONE] All tasks complete.` closes nothing: no command, and what follows is read on (as
    # CodingAgent reads it); a tag whose closing tag follows still opens its block, so a file's
    # text never runs as commands.
    done, create = parse('[DONE] All tasks complete.\n[CREATE_FILE path="a"]\nx\n[/CREATE_FILE]')
    assert isinstance(done, Problem) and done.command == "DONE" and done.line == 1
    assert "has text after its tag" in done.message
    assert isinstance(create, Command) and create.body == "x"
    (block,) = parse(
        '[CREATE_FILE path="README.md"] (the readme)\n[RUN_COMMAND]\necho hi\n[/RUN_COMMAND]\n'
        "[/CREATE_FILE]"
    )
    assert isinstance(block, Command) and block.name is Name.CREATE_FILE
    assert block.lines == ("[RUN_COMMAND]", "echo hi", "[/RUN_COMMAND]")
