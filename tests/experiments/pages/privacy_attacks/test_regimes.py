"""experiments/pages/privacy_attacks/regimes.py: the regimes' words are read whole from their
snippets file."""

from __future__ import annotations

from experiments.pages._markdown import snippets
from experiments.pages.privacy_attacks import regimes


def test_the_regimes_words_are_read_whole_from_their_snippets_file(tmp_path):
    # _markdown.snippets: a piece per "<!-- key -->", its lines in order, the preamble dropped
    (tmp_path / "words.md").write_text(
        "a comment\n\n<!-- A -->\none {x}\n\ntwo\n<!-- B -->\nthree\n"
    )
    got = snippets(str(tmp_path / "page.py"), "words.md")
    assert got == {"A": "one {x}\n\ntwo", "B": "three"}
    for name, r in regimes.REGIMES.items():
        for key in ("scale_note", "regime_text", "reference_words"):
            assert r[key] and "\n" not in r[key], (name, key)
        assert r["regime_text"].endswith("),"), name  # page.md puts the space after it
        assert len(r["not_reached"]) >= 4 and all(r["not_reached"]), name
