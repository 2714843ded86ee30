"""The key schema (mamba_tune.keys) is the one declaration the runtime and the CLI read."""

from __future__ import annotations

import dataclasses

import pytest

from mamba_tune import keys


def test_a_runtime_kernel_must_run_its_keys_source():
    # The source hash covers the key's function: a declaration pairing a key with another
    # kernel would check bundles against the wrong source.
    from mamba_tune import runtime
    from mamba_tune.ssd import bmm, chunk_state

    kw = {"dims_from_args": chunk_state.SSD_CHUNK_STATE.dims_from_args}
    assert runtime.RuntimeKernel(key=keys.SSD_CHUNK_STATE, kernel=chunk_state.chunk_state_kernel, **kw).name == (
        "ssd_chunk_state")
    with pytest.raises(ValueError, match="ssd_chunk_state: kernel bmm_chunk_kernel .* is not its key's source"):
        runtime.RuntimeKernel(key=keys.SSD_CHUNK_STATE, kernel=bmm.bmm_chunk_kernel, **kw)


def test_every_key_needs_a_tuning_record():
    from autotune_cli import tuning

    records = tuple(tk for tk in tuning.KERNELS if tk.name != "ssd_bmm")
    with pytest.raises(ValueError, match="no tuning record for kernel ssd_bmm"):
        tuning._by_name(records)


def test_size_dims_must_be_key_dims():
    with pytest.raises(ValueError, match=r"ssd_bmm: size_dims \['nheads'\] are not key dims"):
        dataclasses.replace(keys.SSD_BMM, size_dims=("batch", "nheads"))


def test_the_source_hash_covers_the_function_and_its_decorator(tmp_path):
    src = tmp_path / "k.py"
    src.write_text("import x\n\n\n@dec(a=1)\ndef f(y):\n    return y\n\n\ndef g():\n    pass\n")
    import hashlib

    assert keys.source_sha256(src, "f") == hashlib.sha256(b"@dec(a=1)\ndef f(y):\n    return y\n").hexdigest()
    with pytest.raises(LookupError, match="no function h in"):
        keys.source_sha256(src, "h")
