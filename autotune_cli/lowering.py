"""Check on the CPU that configs still lower: Helion's real compiler front end, no GPU."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from mamba_tune.bundle import Bundle, Entry
from mamba_tune.keys import ModelShape
from mamba_tune.vocab import torch_dtype

# torch, helion and the kernels (autotune_cli.tuning) load where they are used: importing
# them takes seconds, and `python -m autotune_cli.lowering` with bad arguments answers
# before that.
if TYPE_CHECKING:
    from autotune_cli.tuning import TunableKernel


def lower(tk: TunableKernel, dims: dict[str, int], dtype: str, config: dict[str, Any] | None) -> str:
    """Generated Triton source for `config` (None: the kernel's default config) at `dims`."""
    import helion

    if os.environ.get("HELION_INTERPRET") == "1":
        raise RuntimeError("lowering needs compiled mode: unset HELION_INTERPRET")
    bound = tk.kernel.bind(shape_args(tk, dims, dtype))
    cfg = tk.default_for(bound, dims) if config is None else helion.Config.from_dict(config)
    return triton_source(bound, cfg)


def triton_source(bound: Any, config: Any) -> str:
    """`bound.to_triton_code(config)`, parsed by Python too: the GPU imports that source, and
    code that Python rejects (seen on the H200: host code with an `if` left without a body)
    only failed there. Raises SyntaxError naming the kernel.

    Kept per bound kernel and config for the process: a search seed that is the kernel's default
    config (about one check in five) is lowered once (half a second of Helion's code generation)."""
    import helion

    config = config if isinstance(config, helion.Config) else helion.Config.from_dict(config)
    done = _TRITON_SOURCES.setdefault(bound, {})
    code = done.get(config)
    if code is None:
        code = bound.to_triton_code(config)
        compile(code, f"<generated Triton code of {bound.kernel.name}>", "exec")
        done[config] = code
    return code


# Bound kernel (weakly: Helion drops its bound kernels on reset) -> config -> its generated code.
_TRITON_SOURCES: weakref.WeakKeyDictionary[Any, dict[Any, str]] = weakref.WeakKeyDictionary()


def compile_for_gpu(bound: Any, config: Any, args: tuple[Any, ...], capability: int = 90, num_sms: int = 132) -> Any:
    """Compile the config's Triton kernel down to a cubin for a CUDA GPU of this compute
    capability (90: the H200), on a CPU: Triton's whole compiler (TTIR, TTGIR, LLVM, PTX, ptxas),
    further than `triton_source`. The host code runs on `args` (CPU tensors, their data unread)
    up to its launch, where `cubin_launcher` compiles instead of launching; a persistent
    kernel's host code sizes its grid by `num_sms` (the H200's 132). Returns Triton's compiled
    kernel (`.asm["ptx"]`, `.metadata.shared`); raises the compiler's error."""
    import helion.runtime

    compiled: list[Any] = []
    host = bound.compile_config(config, allow_print=False)
    get_num_sm = helion.runtime.get_num_sm
    helion.runtime.get_num_sm = lambda device, *a, **k: num_sms if device.type == "cpu" else get_num_sm(device, *a, **k)
    try:
        host(*args, _launcher=cubin_launcher(capability, compiled))
    finally:
        helion.runtime.get_num_sm = get_num_sm
    if not compiled:
        raise RuntimeError(f"{bound.kernel.name}: the host code launched no kernel")
    return compiled[0]


def cubin_launcher(capability: int = 90, compiled: list[Any] | None = None) -> Any:
    """A Helion `_launcher` (the keyword a compiled host function takes) that compiles each
    launched Triton kernel to a cubin for this compute capability instead of running it, as a
    GPU's first launch does: the compiler's error raises from the host call, and each compiled
    kernel is appended to `compiled`. Pointers aligned to 16 bytes and ints divisible by 16 are
    specialized as a launch on the GPU does, so the software pipeline the compiler builds is
    the one the GPU gets."""

    def launch(kernel: Any, grid: Any, *kargs: Any, num_warps: int, num_stages: int, **_kw: Any) -> None:
        done = _compile_launch(kernel, kargs, num_warps, num_stages, capability)
        if compiled is not None:
            compiled.append(done)

    return launch


def _compile_launch(kernel: Any, kargs: tuple[Any, ...], num_warps: int, num_stages: int, capability: int) -> Any:
    import triton
    from triton.backends.compiler import GPUTarget

    return triton.compile(_ast_source(kernel, kargs), target=GPUTarget("cuda", capability, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages})


def _ast_source(kernel: Any, kargs: tuple[Any, ...]) -> Any:
    """Triton's compiler input for one launch of `kernel` on `kargs`, specialized as a GPU launch is."""
    import torch
    from triton.compiler import ASTSource

    names = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32",
             torch.int64: "i64", torch.bool: "i1", torch.int8: "i8", torch.uint8: "u8"}
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    attrs: dict[tuple[int, ...], list[list[Any]]] = {}
    for i, (name, param, a) in enumerate(zip(kernel.arg_names, kernel.params, kargs, strict=True)):
        if param.is_constexpr:
            constexprs[name] = a
            continue
        if isinstance(a, torch.Tensor):
            signature[name] = "*" + names[a.dtype]
            aligned = a.data_ptr() % 16 == 0
        elif isinstance(a, bool):
            signature[name], aligned = "i1", False
        elif isinstance(a, int):
            signature[name] = "i32" if -2**31 <= a < 2**31 else "i64"
            aligned = a % 16 == 0
        elif isinstance(a, float):
            signature[name], aligned = "fp32", False
        else:
            raise TypeError(f"{kernel.fn.__name__}: launch argument {name} of type {type(a).__name__}")
        if aligned:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)


def dropped_loop_carries(bound: Any, config: Any, args: tuple[Any, ...], capability: int = 90) -> list[str]:
    """The variables of the config's generated Triton kernels that change from one iteration of a loop
    to the next but that Triton's front end does not carry through it ("kernel line N: name", N the
    loop's line in the kernel); empty when every one is carried. Triton decides what a loop carries
    from one dry pass over its body: a variable is carried only where that pass changes its value,
    so a shift of registers that start as one value (`x3 = x2; x2 = x1; x1 = new` after
    `x1 = x2 = x3 = zero`) carries x1 alone, and on the GPU x2 and x3 stay zero, silently. A
    variable copied in the body from one that changes changes too (to a fixed point). Helion's ref
    mode and Triton's interpreter (TRITON_INTERPRET=1: the loop runs in Python) both compute the
    intended values, so only this catches it on a CPU. Runs the host code on `args` (CPU tensors) up to each launch and Triton's
    front end (to TTIR) on the launched kernel; nothing is compiled further or run."""
    import ast

    from triton._C.libtriton import ir
    from triton.backends.compiler import GPUTarget
    from triton.compiler import code_generator as cg
    from triton.compiler.compiler import make_backend

    dropped: list[str] = []
    find_carries = cg.CodeGenerator._find_carries

    def checked(self: Any, node: Any, liveins: dict[str, Any], ignore: set[str] = frozenset()) -> Any:
        found = find_carries(self, node, liveins, ignore)
        # Where each variable's value at the end of the body comes from: a variable that was live
        # before the loop, copied by plain assignments (`b_copy = b; a = b_copy`), or None (computed).
        source: dict[str, str | None] = {name: name for name in liveins}
        for stmt in node.body:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and isinstance(stmt.value, ast.Name)):
                source[stmt.targets[0].id] = source.get(stmt.value.id)
                continue
            for n in ast.walk(stmt):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    source[n.id] = None
        # A copy of a variable that changes changes too (to a fixed point: x3 = x2; x2 = x1; x1 = new).
        changes = set(found[0])
        grown = True
        while grown:
            grown = False
            for name, src in source.items():
                if (name in liveins and name not in changes and name not in ignore and src not in (None, name)
                        and src in changes and cg._is_triton_value(liveins[name])):
                    changes.add(name)
                    grown = True
        dropped.extend(f"{self.function_name} line {node.lineno}: {name}" for name in sorted(changes - set(found[0])))
        return found

    def front_end(kernel: Any, grid: Any, *kargs: Any, num_warps: int, num_stages: int, **_kw: Any) -> None:
        target = GPUTarget("cuda", capability, 32)
        backend = make_backend(target)
        options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages})
        context = ir.context()
        ir.load_dialects(context)
        backend.load_dialects(context)
        _ast_source(kernel, kargs).make_ir(target, options, backend.get_codegen_implementation(options),
                                           backend.get_module_map(), context)

    cg.CodeGenerator._find_carries = checked
    try:
        bound.compile_config(config, allow_print=False)(*args, _launcher=front_end)
    finally:
        cg.CodeGenerator._find_carries = find_carries
    return dropped


def ptxas_usage(compiled: Any, capability: int = 90) -> dict[str, int]:
    """What ptxas reports for a `compile_for_gpu` kernel: registers per thread and spill bytes
    (stores, loads): the occupancy a config gets and whether its live values fit, on the CPU."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    arch = f"sm_{capability}a" if capability >= 90 else f"sm_{capability}"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(compiled.asm["ptx"])
        f.flush()
        res = subprocess.run([get_ptxas(capability).path, "-v", "--gpu-name", arch, f.name, "-o", os.devnull],
                             capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        raise RuntimeError(f"ptxas failed: {res.stderr.strip()[-500:]}")
    regs = re.search(r"Used (\d+) registers", res.stderr)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    if regs is None or spills is None:
        raise RuntimeError(f"ptxas -v printed no usage: {res.stderr.strip()[-500:]}")
    return {"registers": int(regs.group(1)), "spill_stores": int(spills.group(1)),
            "spill_loads": int(spills.group(2))}


# Config keys that Helion only accepts when the local device is a CUDA GPU of the right
# capability (ConfigSpec.supports_config_key); a CPU box cannot lower them as given.
DEVICE_ONLY_KEYS = ("host_tensor_descriptors",)


def cpu_loweable(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The config without device-only keys, and a note for each one that was set (truthy).

    A key at its off value changes nothing in the generated code, so dropping it checks
    the same program; a key that is on cannot be checked here and is reported.
    """
    kept = {k: v for k, v in config.items() if k not in DEVICE_ONLY_KEYS}
    notes = [f"{k}={config[k]!r} not checkable without the GPU" for k in DEVICE_ONLY_KEYS if config.get(k)]
    return kept, notes


def lower_bundle(bundle: Bundle, progress: Callable[[int, int], None] | None = None,
                 entries: dict[str, Entry] | None = None) -> list[tuple[str, str]]:
    """(key, error) for every entry (of `entries`, a part of the bundle's; default all) whose config
    no longer lowers; empty when all do. `progress(done, total)` is called before each entry."""
    from autotune_cli.tuning import all_kernels

    kernels = all_kernels()
    entries = bundle.entries if entries is None else entries
    problems: list[tuple[str, str]] = []
    for i, (key, entry) in enumerate(entries.items()):
        if progress is not None:
            progress(i, len(entries))
        tk = kernels.get(entry.kernel)
        if tk is None:
            problems.append((key, f"unknown kernel {entry.kernel!r}"))
            continue
        config, _notes = cpu_loweable(entry.config)
        why = _lowered(tk, entry.dims, entry.dtype, config)
        if why is not None:
            problems.append((key, why))
    return problems


# (kernel, dims, dtype, config) -> None where it lowered, else its error: one SKU's bundle often
# holds the same config at the same key as its sibling's (an H100 search warm-started from the
# H200's entry keeps it), and lowering is deterministic, so a process lowers each one once.
_LOWERED: dict[str, str | None] = {}


def _lowered(tk: TunableKernel, dims: dict[str, int], dtype: str, config: dict[str, Any]) -> str | None:
    """None where `config` lowers at `dims`, else the error's first line (memoized in the process)."""
    memo = json.dumps([tk.name, dims, dtype, config], sort_keys=True)
    if memo not in _LOWERED:
        try:
            lower(tk, dims, dtype, config)
            _LOWERED[memo] = None
        except Exception as e:  # any compiler error is a finding, reported per entry
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            _LOWERED[memo] = f"{type(e).__name__}: {first}"
    return _LOWERED[memo]


def compile_bundle(bundle: Bundle, progress: Callable[[int, int], None] | None = None
                   ) -> list[tuple[str, dict[str, int] | None, str | None]]:
    """Every entry's config compiled for the bundle's GPU (`compile_for_gpu`, `ptxas_usage`):
    (key, {"registers", "spill_stores", "spill_loads", "shared"} or None, the error or None).
    `progress(done, total)` is called before each entry."""
    import helion

    from autotune_cli.tuning import all_kernels

    capability = int(bundle.provenance.gpu.arch.removeprefix("sm"))
    kernels = all_kernels()
    results: list[tuple[str, dict[str, int] | None, str | None]] = []
    for i, (key, entry) in enumerate(bundle.entries.items()):
        if progress is not None:
            progress(i, len(bundle.entries))
        tk = kernels.get(entry.kernel)
        if tk is None:
            results.append((key, None, f"unknown kernel {entry.kernel!r}"))
            continue
        config, _notes = cpu_loweable(entry.config)
        try:
            with compiled_mode(tk.kernel):
                args = shape_args(tk, entry.dims, entry.dtype)
                compiled = compile_for_gpu(tk.kernel.bind(args), helion.Config.from_dict(config), args, capability)
            results.append((key, {**ptxas_usage(compiled, capability), "shared": compiled.metadata.shared}, None))
        except Exception as e:  # a compiler error is the finding, reported per entry
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            results.append((key, None, f"{type(e).__name__}: {first}"))
    return results


@contextlib.contextmanager
def compiled_mode(kernel: Any) -> Iterator[None]:
    """The kernel in Helion's compiled mode for the block, whatever HELION_INTERPRET says
    (binding builds the config space; in ref mode it is empty)."""
    from helion.runtime.settings import RefMode

    saved = kernel.settings.ref_mode
    if saved == RefMode.OFF:
        yield
        return
    kernel.settings.ref_mode = RefMode.OFF
    kernel.reset()
    try:
        yield
    finally:
        kernel.settings.ref_mode = saved
        kernel.reset()


def meta_args(tk: TunableKernel, dims: dict[str, int], dtype: str) -> tuple[Any, ...]:
    """The kernel's arguments at `dims` as meta tensors (shapes, strides and dtypes; no data).

    The problem is built under a fake tensor mode, so a 16384 x 16384 input costs nothing;
    binding reads only what a meta tensor keeps.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        problem = tk.make_problem(dims, torch_dtype(dtype), torch.device("cpu"), 0)
    return tuple(torch.empty_strided(tuple(a.shape), tuple(a.stride()), dtype=a.dtype, device="meta")
                 if isinstance(a, torch.Tensor) else a for a in problem.args)


def shape_args(tk: TunableKernel, dims: dict[str, int], dtype: str) -> tuple[Any, ...]:
    """The kernel's CPU arguments at `dims` as `make_problem` builds them, without their data.

    What Helion's compiler reads of a tensor is its layout, never its values: binding turns
    every argument into a fake tensor (sizes, strides, dtype, device), and tensor-descriptor
    code also reads the base address's alignment, the storage offset and which inputs share
    a storage. So the problem is built under a fake tensor mode (no random fill, no reference
    forward: at Nemotron-H 47B sizes 27-48 s per bundle entry against 0.2 s on a busy 2-core box)
    and each fake tensor becomes a view, at the same storage offset, of an uninitialized CPU
    storage of the same size, one per fake storage, so aliasing inputs still alias. A fresh
    storage is as aligned as the one `make_problem` allocates (the CPU allocator's 64 bytes).
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        problem = tk.make_problem(dims, torch_dtype(dtype), torch.device("cpu"), 0)
    storages: dict[int, Any] = {}

    def real(a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        fake_storage = a.untyped_storage()
        storage = storages.get(fake_storage._cdata)
        if storage is None:
            storage = storages[fake_storage._cdata] = torch.UntypedStorage(fake_storage.nbytes())
        t = torch.empty(0, dtype=a.dtype)
        t.set_(storage, a.storage_offset(), tuple(a.shape), tuple(a.stride()))
        return t.requires_grad_(a.requires_grad)

    return tuple(real(a) for a in problem.args)


# (kernel, dims, dtype) -> the bound kernel's config space: one bind (about a second of
# Helion's front end) per shape, however many configs a process checks there.
_CONFIG_SPECS: dict[tuple[str, tuple[tuple[str, int], ...], str], Any] = {}


def config_spec(tk: TunableKernel, dims: dict[str, int], dtype: str) -> Any:
    """Helion's config space (ConfigSpec) for the kernel bound at `dims`, built on the CPU."""
    key = (tk.name, tuple(sorted(dims.items())), dtype)
    spec = _CONFIG_SPECS.get(key)
    if spec is None:
        import helion

        with compiled_mode(tk.kernel):
            try:
                spec = tk.kernel.bind(meta_args(tk, dims, dtype)).config_spec
            except helion.exc.InductorLoweringError:
                # On the H200 host (torch 2.11) binding meta tensors fails in every kernel with a
                # reduction over a tile (Inductor asserts on the meta layout, and a sweep
                # once re-tuned six sound entries for it): bind CPU tensors of the
                # same layout instead (shape_args: no data, an uninitialized storage each).
                spec = tk.kernel.bind(shape_args(tk, dims, dtype)).config_spec
        _CONFIG_SPECS[key] = spec
    return spec


def config_problem(tk: TunableKernel, entry: Entry) -> str | None:
    """Why the entry's config does not fit its kernel at its dims (None: it fits).

    The check the runtime runs before it compiles a config (`mamba_tune.config_schema.
    checked_config`: the kernel's list lengths and allowed values, then Helion's
    `ConfigSpec.normalize`) against the kernel bound at the entry's dims, on the CPU without
    a GPU. Device-only keys are left out (see `cpu_loweable`)."""
    return config_problem_at(tk, entry.config, entry.dims, entry.dtype)


def config_problem_at(tk: TunableKernel, config: dict[str, Any], dims: dict[str, int], dtype: str) -> str | None:
    """`config_problem` for a config at `dims` and `dtype` (the tuner's check of a sibling's config)."""
    from mamba_tune.config_schema import checked_config

    config, _notes = cpu_loweable(config)
    try:
        checked_config(config, config_spec(tk, dims, dtype))
    except Exception as e:  # ConfigError mostly; any error here means the runtime cannot use it
        text = str(e).strip()
        return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"
    return None


def invalid_configs(bundle: Bundle) -> list[tuple[str, str]]:
    """(key, why) for every entry whose config Helion rejects (or whose kernel is unknown)."""
    from autotune_cli.tuning import all_kernels

    kernels = all_kernels()
    problems: list[tuple[str, str]] = []
    for key, entry in bundle.entries.items():
        tk = kernels.get(entry.kernel)
        why = f"unknown kernel {entry.kernel!r}" if tk is None else config_problem(tk, entry)
        if why is not None:
            problems.append((key, why))
    return problems


# Layer shapes at which every kernel's default config must lower: odd sizes, one group,
# seqlen not a multiple of chunk_size, and a real model (Nemotron-3 Nano, TP 2).
LOWERING_SHAPES = [
    ModelShape(batch=1, seqlen=100, nheads=4, headdim=16, ngroups=2, dstate=16, chunk_size=32),
    ModelShape(batch=2, seqlen=48, nheads=3, headdim=24, ngroups=1, dstate=8, chunk_size=16),
    ModelShape(batch=2, seqlen=8192, nheads=32, headdim=64, ngroups=4, dstate=128, chunk_size=128),
]


# Real model shapes at which every kernel's search seeds must reach Helion as written and
# lower: Nemotron-3 Nano TP2 (groups of 512, chunk 128) and Mamba2-2.7B (one 5120-wide
# group, chunk 256), where the seeds' block sizes and warps differ.
SEED_SHAPES = [
    LOWERING_SHAPES[-1],
    ModelShape(batch=2, seqlen=8192, nheads=80, headdim=64, ngroups=1, dstate=128, chunk_size=256),
]

# Where a per-shape rule runs kernels that the shapes above never reach: the dB/dC backward's two
# passes at dstate 256 (Nemotron-H 47B, mamba_tune.keys.two_pass_dbdc). Only those kernels are
# checked here (seeds and default configs), so the work stays per kernel.
RULE_SHAPES = [
    ModelShape(batch=2, seqlen=8192, nheads=256, headdim=64, ngroups=8, dstate=256, chunk_size=128),
]


def shapes_for(tk: TunableKernel, shapes: list[ModelShape]) -> list[ModelShape]:
    """The shapes of `shapes` at which the kernel is checked (`dims_to_check`), else the RULE_SHAPES."""
    return ([s for s in shapes if tk.dims_to_check(s) is not None]
            or [s for s in RULE_SHAPES if tk.dims_to_check(s) is not None])


def check_seeds(tk: TunableKernel, dims: dict[str, int], dtype: str) -> list[str]:
    """Problems with the kernel's search seeds at `dims`: a seed Helion would drop or change
    (it skips seeds that do not fit the config space, with only a log line) or that fails
    to lower. Empty when every seed reaches the search as written."""
    import helion

    from autotune_cli.warm_start import seed_configs

    bound = tk.kernel.bind(shape_args(tk, dims, dtype))
    gen = bound.config_spec.create_config_generation(overrides=None, advanced_controls_files=None,
                                                     process_group_name=None)
    problems = []
    for seed in seed_configs(tk, dims, None):
        logs: list[str] = []
        pairs = gen.user_seed_flat_config_pairs([seed], logs.append)
        if not pairs:
            problems.append(f"seed {dict(seed)} rejected: {'; '.join(logs) or 'no reason given'}")
            continue
        normalized = pairs[0][1]
        changed = [k for k in seed if normalized.get(k) != seed[k]]
        if changed:
            problems.append(f"seed {dict(seed)} changed by Helion in {changed}")
            continue
        try:
            triton_source(bound, helion.Config.from_dict(dict(normalized)))
        except Exception as e:  # a compiler error is the finding
            problems.append(f"seed {dict(seed)} does not lower: {type(e).__name__}: {e}")
    return problems


def shard(index: int, count: int) -> tuple[list[TunableKernel], Callable[[Entry], bool]]:
    """Part `index` of `count` of `main`'s work: every count-th kernel by name from the index-th,
    and which bundle entries are its part: those of its kernels (an unknown kernel's, part 0's).
    An entry is lowered in the process that checked its kernel, which has bound the kernel at the
    shapes both use (Helion keeps a bound kernel per shape; with kernels and bundles dealt out
    apart, the two parts bound them twice: 261 s of CPU against 203 s in one process)."""
    from autotune_cli.tuning import all_kernels

    kernels = list(all_kernels().values())
    mine = kernels[index::count]
    names = {tk.name for tk in mine}
    known = {tk.name for tk in kernels}
    return mine, lambda entry: entry.kernel in names or (index == 0 and entry.kernel not in known)


def main(argv: list[str] | None = None) -> int:
    """Lower every kernel's default config at LOWERING_SHAPES, every search seed at
    SEED_SHAPES (each at RULE_SHAPES where none reaches it), and every committed bundle config.
    `--shard I/N` does part I of N (`shard`: a share of the kernels with their bundle entries), so
    that N processes can share it."""
    args = sys.argv[1:] if argv is None else argv
    index, count = 0, 1
    if args:
        if len(args) != 2 or args[0] != "--shard" or not re.fullmatch(r"\d+/[1-9]\d*", args[1]):
            print("usage: python -m autotune_cli.lowering [--shard I/N]  (0 <= I < N)", file=sys.stderr)
            return 2
        index, count = map(int, args[1].split("/"))
        if index >= count:
            print(f"--shard {args[1]}: I must be below N", file=sys.stderr)
            return 2
    from mamba_tune.bundle import BundleError, find_bundles, load_bundle
    from mamba_tune.runtime import default_bundle_paths

    kernels, in_part = shard(index, count)
    failures = sum(_lower_kernel(tk) for tk in kernels)
    for path in find_bundles(default_bundle_paths()):
        try:
            bundle = load_bundle(path)
        except BundleError as e:
            failures += 1
            print(f"FAIL {e}")
            continue
        part = {key: e for key, e in bundle.entries.items() if in_part(e)}
        bad = lower_bundle(bundle, entries=part)
        failures += len(bad)
        for key, why in bad:
            print(f"FAIL {path}: {key}: {why}")
        print(f"{'ok  ' if not bad else 'FAIL'} {path}: {len(part) - len(bad)}/{len(part)} configs lower")
    return 1 if failures else 0


def _lower_kernel(tk: TunableKernel) -> int:
    """Check the kernel's seeds and lower its default configs; the number of failures."""
    failures = 0
    for shape in shapes_for(tk, SEED_SHAPES):
        dims = tk.dims_to_check(shape)
        if tk.seed_configs is None:
            continue
        bad_seeds = check_seeds(tk, dims, "bf16")
        failures += len(bad_seeds)
        for why in bad_seeds:
            print(f"FAIL {tk.name} {dims}: {why}")
        print(f"{'ok  ' if not bad_seeds else 'FAIL'} {tk.name} {len(tk.seed_configs(dims))} search seeds at {dims}")
    for shape in shapes_for(tk, LOWERING_SHAPES):
        dims = tk.dims_to_check(shape)
        for dtype in ("bf16", "fp32"):
            try:
                lower(tk, dims, dtype, None)
                print(f"ok   {tk.name} {dims} {dtype} default config")
            except Exception as e:
                failures += 1
                print(f"FAIL {tk.name} {dims} {dtype} default config: {type(e).__name__}: {e}")
    return failures


if __name__ == "__main__":
    raise SystemExit(main())
