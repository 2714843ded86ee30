"""Bundle format v1: round trip, stable layout, validation errors, atomic writes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from bundles import bundle, entry, norm_dims

from mamba_tune.bundle import (
    BundleError,
    dumps_bundle,
    entry_key,
    load_bundle,
    parse_bundle,
    parse_key,
    write_bundle,
)


def test_round_trip_and_stable_text(tmp_path):
    b = bundle(entry(), entry("gated_norm_bwd", tuned_ms=0.09), entry(dims=norm_dims(rows=8192)))
    p = tmp_path / "h200" / "x.json"
    write_bundle(b, p)
    loaded = load_bundle(p)
    assert loaded == b
    text = p.read_text()
    assert dumps_bundle(loaded) == text  # writing what was read changes nothing
    data = json.loads(text)
    assert list(data) == sorted(data) and list(data["entries"]) == sorted(data["entries"])
    # Helion's short int lists stay on one line: diffs show one changed line per field.
    assert '"block_sizes": [8, 1]' in text


def test_adopted_from_is_written_only_where_set():
    # An entry that took a sibling's config (`sweep --adopt-sibling`) says so; the others stay
    # as bundles were before the field (no key written).
    plain = entry()
    adopted = entry(dims=norm_dims(rows=8192))
    adopted = adopted.model_copy(update={"search": adopted.search.model_copy(update={"adopted_from": "h100"})})
    text = dumps_bundle(bundle(plain, adopted))
    data = json.loads(text)["entries"]
    assert data[adopted.key]["search"]["adopted_from"] == "h100"
    assert "adopted_from" not in data[plain.key]["search"]
    assert parse_bundle(text, source="b.json").entries[adopted.key].search.adopted_from == "h100"


def test_write_is_atomic_and_leaves_no_temp_files(tmp_path):
    p = tmp_path / "b.json"
    write_bundle(bundle(entry()), p)
    before = p.read_text()
    bad = bundle(entry()).model_copy(update={"entries": {"wrong|key|bf16": entry()}})
    with pytest.raises(BundleError):
        write_bundle(bad, p)
    assert p.read_text() == before
    assert [q.name for q in tmp_path.iterdir()] == ["b.json"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"])
def test_bundle_mode_follows_the_umask(tmp_path, umask, mode):
    # In a child process, so the umask of the test process stays as it is.
    p = tmp_path / "b.json"
    code = ("import os, sys; sys.path[:0] = sys.argv[3:]; os.umask(int(sys.argv[1], 8)); "
            "from bundles import bundle, entry; from mamba_tune.bundle import write_bundle; "
            "write_bundle(bundle(entry()), sys.argv[2]); write_bundle(bundle(entry()), sys.argv[2])")
    here = Path(__file__).resolve().parents[1]  # tests/
    subprocess.run([sys.executable, "-c", code, oct(umask), str(p), str(here), str(here.parent)], check=True)
    assert stat.S_IMODE(os.stat(p).st_mode) == mode  # a rewrite too: the second write replaced the first


def test_entry_key_is_canonical():
    dims = norm_dims()
    assert entry_key("k", dims, "bf16") == entry_key("k", dict(reversed(list(dims.items()))), "bf16")
    kernel, parsed, dtype = parse_key(entry_key("k", dims, "bf16"))
    assert (kernel, parsed, dtype) == ("k", dims, "bf16")


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.update(schema_version=2), r"schema_version 2 is not supported"),
        (lambda d: d["entries"].update({"bad|key|bf16": next(iter(d["entries"].values()))}),
         r"key does not match its fields"),
        (lambda d: next(iter(d["entries"].values()))["accuracy"].update(passed=False), r"accuracy.passed is false"),
        (lambda d: next(iter(d["entries"].values()))["timing"].update(tuned_ms=-1.0), r"timing.tuned_ms"),
        (lambda d: next(iter(d["entries"].values())).update(dtype="int8"), r"dtype: Input should be"),
        (lambda d: d["provenance"].pop("gpu"), r"provenance.gpu: Field required"),
        (lambda d: d.update(extra_field=1), r"extra_field: Extra inputs are not permitted"),
        (lambda d: next(iter(d["entries"].values()))["speedup"].update(vs_default=float("nan")),
         r"not valid JSON: NaN is not a JSON number"),
        (lambda d: next(iter(d["entries"].values()))["speedup"].update(vs_baseline=float("inf")),
         r"not valid JSON: Infinity is not a JSON number"),
        (lambda d: next(iter(d["entries"].values()))["search"].update(adopted_from="H200 SXM"),
         r"search.adopted_from: String should match pattern"),
        (lambda d: next(iter(d["entries"].values()))["search"].update(adopted_from=200),
         r"search.adopted_from: Input should be a valid string"),
        (lambda d: next(iter(d["entries"].values()))["search"].update(adopted_from="h200"),
         r"search.adopted_from: 'h200' is the SKU the bundle was tuned on"),
    ],
    ids=["version", "key", "failed-accuracy", "timing", "dtype", "missing", "extra", "nan", "inf",
         "adopted-pattern", "adopted-type", "adopted-own-sku"],
)
def test_invalid_bundles_give_one_line(mutate, match):
    data = json.loads(dumps_bundle(bundle(entry())))
    mutate(data)
    with pytest.raises(BundleError, match=match) as e:
        parse_bundle(json.dumps(data), source="b.json")
    assert "\n" not in str(e.value) and str(e.value).startswith("b.json")


def test_not_json():
    with pytest.raises(BundleError, match=r"^b.json:2:14: not valid JSON: expecting value$"):
        parse_bundle('{\n  "entries": ,\n}', source="b.json")


@pytest.mark.parametrize("text,message", [
    ('{\n  "schema_version": 3,\n  "entr', "b.json:3:3: not valid JSON: expecting '\"' to close the string that "
     "starts here (the file ends before it: truncated?)"),
    ('{\n  "schema_version": 3,\n  "entries": {\n', "b.json:4:1: not valid JSON: expecting property name "
     "enclosed in double quotes (the file ends before it: truncated?)"),
    ('{\n  "schema_version": 3,\n  "entries": [1, \n', "b.json:4:1: not valid JSON: expecting value (the file "
     "ends before it: truncated?)"),
])
def test_truncated_json_names_line_column_and_what_was_expected(text, message):
    """json's own message for a string never closed stops at "starting at"."""
    with pytest.raises(BundleError) as e:
        parse_bundle(text, source="b.json")
    assert str(e.value) == message


def test_non_finite_speedup_written_as_a_big_number_is_invalid():
    # 1e400 is valid JSON that Python reads as inf: the model check catches what the parser cannot.
    text = dumps_bundle(bundle(entry()))
    old = json.loads(text)
    vs = next(iter(old["entries"].values()))["speedup"]["vs_default"]
    clean = text
    text = text.replace(f'"vs_default": {json.dumps(vs)}', '"vs_default": 1e400', 1)
    with pytest.raises(BundleError, match=r"^b.json: entries.gated_norm_fwd\|.*\|bf16.speedup.vs_default: inf is not "
                                          r"a finite number"):
        parse_bundle(text, source="b.json")
    cfg = clean.replace('"num_warps": 4', '"num_warps": -1e999', 1)
    with pytest.raises(BundleError, match=r"config.num_warps: -inf is not a finite number"):
        parse_bundle(cfg, source="b.json")


def test_duplicate_keys_and_deep_nesting_are_one_line():
    text = dumps_bundle(bundle(entry()))
    with pytest.raises(BundleError, match=r"^b.json: duplicate key 'tuned_ms' in one JSON object$"):
        parse_bundle(text.replace('"tuned_ms": ', '"tuned_ms": 1.0, "tuned_ms": ', 1), source="b.json")
    with pytest.raises(BundleError, match=r"^b.json: nested too deeply to be a bundle$"):
        parse_bundle("[" * 100_000 + "]" * 100_000, source="b.json")


def test_endless_file_is_refused_after_the_size_limit():
    with pytest.raises(BundleError, match=r"^/dev/zero: over 64 MiB; not a bundle"):
        load_bundle("/dev/zero")


def test_binary_bundle_is_one_line(tmp_path):
    p = tmp_path / "b.json"
    p.write_bytes(b'{"a":\n\xff\xfe}')
    with pytest.raises(BundleError, match=r"b.json:2: not UTF-8 text \(byte 6: b'\\xff'\)$"):
        load_bundle(p)


def test_git_ignores_the_temp_files_of_an_interrupted_write():
    import shutil
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    # The name write_text_atomic gives its temp file, next to the bundle.
    r = subprocess.run(["git", "check-ignore", "-q", "generated_configs/h200/.nemotron-nano.json.k3x_9a.tmp"],
                       cwd=root)
    assert r.returncode == 0
