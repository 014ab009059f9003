"""The tests are laid out like the package (issue 49, item 8): a test of
onnx_sbs_nb/align/judge/ lives in tests/align/judge/, only the tests of the package as a
whole sit in tests/ itself, and no module is named by a sequence number (zoo2, bugs2) that
says when it was written rather than what it holds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import onnx_sbs_nb

TESTS = Path(__file__).resolve().parent
PACKAGE = Path(onnx_sbs_nb.__file__).resolve().parent

# At most this many test files directly in tests/: the package-wide ones (layering,
# packaging, security, notebooks, ...); everything else goes to the folder it tests.
MAX_TOP_LEVEL_TESTS = 12

# tests/ sub-folders that test no one folder of the package: the corpus (models nobody
# here tuned for, run through the whole engine), the browser tests, the ONNX backend suite.
EXCEPTIONS = {"corpus", "ui", "conformance"}

# A word ending in digits is a sequence number unless the word is one of these: the digits
# are then part of a real name (int4, fp16, bf16, sha256, utf8, gpt2, t5, x86, opset18...).
REAL_NAMES = {
    "int", "uint", "float", "fp", "bf", "sha", "utf", "base", "x", "gpt", "t", "mt", "llama",
    "opset", "md", "crc", "pt", "qwen", "phi", "gemma", "olmo", "starcoder", "swin", "convnext",
}  # fmt: skip


def numbered_words(stem: str) -> list[str]:
    """The words of a module name that are a word followed by a sequence number
    (``zoo2``, ``bugs2``, ``corpus2``), or a bare number (``zoo_2``)."""
    out = []
    for word in stem.split("_"):
        m = re.fullmatch(r"([a-z]*)(\d+)", word)
        if m and m.group(1) not in REAL_NAMES:
            out.append(word)
    return out


def top_level_tests(tests: Path) -> list[str]:
    return sorted(p.name for p in tests.glob("test_*.py"))


def unmirrored_folders(tests: Path, package: Path) -> list[str]:
    """tests/ sub-folders (outside the exceptions) with no package folder of that path."""
    out = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = folder.relative_to(tests)
        if rel.parts[0] in EXCEPTIONS or "__pycache__" in rel.parts:
            continue
        if not (package / rel).is_dir():
            out.append(rel.as_posix())
    return out


@pytest.mark.parametrize(
    "name",
    ["zoo2", "test_corpus2_defects", "test_corpus_exporter_bugs2", "zoo_6", "test_zoo3", "bugs10"],
)
def test_a_sequence_number_in_a_name_is_found(name):
    assert numbered_words(name)


@pytest.mark.parametrize(
    "name",
    [
        "test_int4_kernels", "test_fp16_casts", "test_bf16", "test_sha256_names", "test_conv1d",
        "test_float8_e4m3", "test_gpt2_cache", "test_opset18", "test_utf8_names", "zoo",
        "test_lowbit_types", "test_t5_buckets", "test_x86_features", "test_untrusted_pt2",
    ],
)  # fmt: skip
def test_a_digit_in_a_real_name_is_no_sequence_number(name):
    assert numbered_words(name) == []


def test_no_module_is_named_by_a_sequence_number():
    named = [
        p.relative_to(TESTS).as_posix()
        for p in TESTS.rglob("*.py")
        if "__pycache__" not in p.parts and numbered_words(p.stem)
    ]
    assert named == [], "name these for what they hold, not by a number"


def test_few_test_files_sit_directly_in_tests():
    top = top_level_tests(TESTS)
    assert len(top) <= MAX_TOP_LEVEL_TESTS, (
        f"{len(top)} test files in tests/ (at most {MAX_TOP_LEVEL_TESTS}): move the ones "
        f"that test one part of the package to its folder: {top}"
    )


def test_every_test_folder_mirrors_a_package_folder():
    assert unmirrored_folders(TESTS, PACKAGE) == []


def test_every_test_folder_is_a_package():
    """tests/ is a package (``from tests.models import ...``, relative imports): a folder
    without __init__.py would be imported under its bare name and clash with another's."""
    missing = [
        p.relative_to(TESTS).as_posix()
        for p in TESTS.rglob("*")
        if p.is_dir() and "__pycache__" not in p.parts and any(p.glob("*.py"))
        and not (p / "__init__.py").exists()
    ]  # fmt: skip
    assert missing == []


def test_the_checks_fail_on_a_flat_or_unmirrored_layout(tmp_path):
    """The folder and count checks on a made-up tree, so that they can fail."""
    tests, package = tmp_path / "tests", tmp_path / "pkg"
    (package / "align" / "judge").mkdir(parents=True)
    for rel in ["align/judge", "align/jugde", "reports", "corpus/extra", "ui"]:
        (tests / rel).mkdir(parents=True)
    for i in range(MAX_TOP_LEVEL_TESTS + 1):
        (tests / f"test_part_{chr(97 + i)}.py").write_text("")
    assert unmirrored_folders(tests, package) == ["align/jugde", "reports"]
    assert len(top_level_tests(tests)) > MAX_TOP_LEVEL_TESTS
