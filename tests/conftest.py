"""Markers of the corpus tests (tests/test_corpus_*.py); pyproject's list holds the rest."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "exporter_bugs: real exporter bugs reproduced with old onnxscript releases "
        "(venvs made by scripts/exporter_bug_venvs.sh; skipped when absent)",
    )
    config.addinivalue_line(
        "markers", "corpus: the zoo of architectures nobody here tuned for (tests/corpus)"
    )
