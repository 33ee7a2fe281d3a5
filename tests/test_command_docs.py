"""Each docs/commands page ends with its command's options as the CLI defines them (tests/command_docs.py writes
that section): a new or changed option that the page does not show fails here. Fix with `python tests/command_docs.py`."""

from __future__ import annotations

from command_docs import PAGES, commands, current_section, page_sections, section


def test_every_command_has_a_page_whose_options_match_the_cli():
    stale = [page.name for page, expected in page_sections().items() if current_section(page) != expected.rstrip("\n") + "\n"]
    assert stale == [], f"run `python tests/command_docs.py` and review the diff of {stale}"


def test_the_section_shows_each_option_with_its_help_default_and_requirement():
    name, command = next((n, c) for n, c in commands() if n == "bisect")
    text = section(name, command)
    assert "| `--data`, `-d` (required) | path | Samples to measure on: .npy/.npz, .txt/.jsonl or images. [required] |" in text
    assert "| `--max-samples` | int | Use at most this many samples. [default: 64] |" in text
    assert "| `ONNX` (required) | path |" in text and text.count("| `--help` | bool |") == 1


def test_a_page_missing_an_option_is_found(tmp_path, monkeypatch):
    import command_docs

    page = PAGES / "doctor.md"
    copy = tmp_path / "doctor.md"
    copy.write_text(page.read_text().replace("| `--json` | bool | Print the result as JSON on stdout. |\n", ""))
    monkeypatch.setattr(command_docs, "PAGES", tmp_path)
    expected = command_docs.page_sections()[tmp_path / "doctor.md"]
    assert command_docs.current_section(copy) != expected.rstrip("\n") + "\n"
