"""The one name check and the one display escape, against the inputs a hostile source sends."""

import pytest

from patcher.display import printable
from patcher.errors import UnsafeName
from patcher.names import checked_digest, checked_name, checked_revision, name_problem


@pytest.mark.parametrize("name", [
    "../x", "a/../../x", "/etc/passwd", "C:evil", "a\\b", "a\0b", "", ".", "a//b", "a/./b",
    ".ssh/id_rsa", ".cache/huggingface/token", "a/.git/config", "x" * 1025, "a/" + "b" * 256,
    "bad\udc80name", 7, None, b"bytes"])
def test_hostile_names_are_refused(name):
    assert name_problem(name) is not None
    with pytest.raises(UnsafeName, match="the hub's listing entry"):
        checked_name(name, what="the hub's listing entry")


@pytest.mark.parametrize("name", ["config.json", "sub/dir/model.safetensors", ".gitattributes",
                                  "a/.hidden-file", "model-00001-of-00119.safetensors"])
def test_plain_names_pass(name):
    assert checked_name(name, what="x") == name


def test_dot_directories_can_be_allowed():
    assert checked_name(".cache/x", what="x", allow_dot_dirs=True) == ".cache/x"


@pytest.mark.parametrize("value", ["../../x", "A" * 64, "a" * 63, "g" * 40, 40, None,
                                   "a" * 40 + "\n"])
def test_digests_are_hex_only(value):
    with pytest.raises(UnsafeName):
        checked_digest(value, what="ETag")


def test_digests_pass():
    assert checked_digest("a" * 40, what="ETag") == "a" * 40
    assert checked_digest("0" * 64, what="oid", lengths=(64,)) == "0" * 64
    with pytest.raises(UnsafeName):
        checked_digest("0" * 40, what="oid", lengths=(64,))


@pytest.mark.parametrize("value", ["main", "v1.0", "refs/pr/1", "a" * 40])
def test_revisions_pass(value):
    assert checked_revision(value) == value


@pytest.mark.parametrize("value", ["../main", "/main", "main/", "a/../b", ".hidden", "a b", "",
                                   "x" * 201, None])
def test_hostile_revisions_are_refused(value):
    with pytest.raises(UnsafeName):
        checked_revision(value)


def test_printable_escapes_every_control():
    hostile = "a\x1b]52;c;cm0gLXJmIH4=\x07b\x1b[2Jc\x9b31md\x7fe\nf\tg\udc80"
    shown = printable(hostile)
    assert all(ord(c) >= 0x20 and not 0x7f <= ord(c) <= 0x9f for c in shown)
    assert shown == ("a\\x1b]52;c;cm0gLXJmIH4=\\x07b\\x1b[2Jc\\x9b31md\\x7fe\\x0af\\x09g\\udc80")


def test_printable_can_keep_line_structure():
    assert printable("a\nb\tc\x1b", keep_lines=True) == "a\nb\tc\\x1b"
    assert printable(3) == "3"


def test_printable_fields_escapes_every_string_of_a_report():
    from patcher.display import printable_fields

    report = {"name\x1b": ["a\nb", {"k": "\x9b2J", "n": 3, "ok": True, "none": None}]}
    assert printable_fields(report) == {
        "name\\x1b": ["a\\x0ab", {"k": "\\x9b2J", "n": 3, "ok": True, "none": None}]}
