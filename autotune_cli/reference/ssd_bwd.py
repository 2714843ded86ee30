"""Reference gradients of the SSD: autograd through the chunked fp32 reference, stage by stage.

`ssd_chunked_grads` runs `autotune_cli.reference.ssd`'s F1-F5 with every stage boundary cut
into a leaf, then back-propagates stage by stage (F5 and F3, then F2 and F4, then F1).
The result holds the gradients of the inputs (what `mamba_chunk_scan_combined`'s backward
returns) and of every intermediate that a backward kernel produces, so each kernel is
checked on its own:

- "states": d chunk end states S_c (the reverse state passing's output, G_{c+1});
  "dA_last": d dA_cumsum[..., -1] through the state passing only; "prev_states".
- "dt_state", "dA_state": d dt~ and d dA_cumsum through F2 (chunk_state_ref) only;
  "dt_scan", "dA_scan": the same through F5 (chunk_scan_ref) only; "CB".
- "x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states": the inputs' gradients.

upcast=False evaluates the same graph in the inputs' low dtype (eager PyTorch): the error
bound of the tests, as in the forward.
"""

from __future__ import annotations

import torch

from autotune_cli.reference.ssd import (
    DT_LIMIT_NONE,
    bmm_chunk_ref,
    chunk_cumsum_ref,
    chunk_scan_ref,
    chunk_state_ref,
    state_passing_ref,
)


def _leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().clone().requires_grad_(t.is_floating_point())


def _grad(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    return torch.zeros_like(t) if t.grad is None else t.grad


def ssd_chunked_grads(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    dy: torch.Tensor,
    dfinal_states: torch.Tensor | None = None,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = DT_LIMIT_NONE,
    upcast: bool = True,
) -> dict[str, torch.Tensor]:
    """Gradients of `ssd_chunked_ref` for output gradient dy (and dfinal_states); see the module docstring.

    Inputs' gradients are in the inputs' dtypes; absent inputs have no entry.
    """
    ins = {"x": _leaf(x), "dt": _leaf(dt), "A": _leaf(A), "B": _leaf(B), "C": _leaf(C), "D": _leaf(D),
           "z": _leaf(z), "dt_bias": _leaf(dt_bias), "initial_states": _leaf(initial_states)}
    with torch.enable_grad():
        dA_cumsum, dt_out = chunk_cumsum_ref(ins["dt"], ins["A"], chunk_size, ins["dt_bias"], dt_softplus, dt_limit)
        dt_state, dA_state = _leaf(dt_out), _leaf(dA_cumsum)
        dt_scan, dA_scan = _leaf(dt_out), _leaf(dA_cumsum)
        dA_last = _leaf(dA_cumsum[..., -1])
        states = chunk_state_ref(ins["B"], ins["x"], dt_state, dA_state, seq_idx, upcast=upcast)
        states_leaf = _leaf(states)
        prev, final = state_passing_ref(states_leaf, dA_last, ins["initial_states"], seq_idx, chunk_size,
                                        out_dtype=torch.float32 if upcast else C.dtype)
        prev_leaf = _leaf(prev)
        cb = bmm_chunk_ref(ins["C"], ins["B"], chunk_size, seq_idx, upcast=upcast)
        cb_leaf = _leaf(cb)
        out = chunk_scan_ref(cb_leaf, ins["x"], dt_scan, dA_scan, ins["C"], prev_leaf, ins["D"], ins["z"], seq_idx,
                             upcast=upcast)
        # Stage by stage, from the output back to the inputs.
        out.backward(dy)
        roots, grads = [prev], [_grad(prev_leaf)]
        if dfinal_states is not None:
            roots.append(final)
            grads.append(dfinal_states.to(final.dtype))
        torch.autograd.backward(roots, grads)
        torch.autograd.backward([states, cb], [_grad(states_leaf), _grad(cb_leaf)])
        ddA = _grad(dA_state) + _grad(dA_scan)
        ddA[..., -1] += _grad(dA_last)
        torch.autograd.backward([dA_cumsum, dt_out], [ddA, _grad(dt_state) + _grad(dt_scan)])
    result = {name: _grad(t) for name, t in ins.items() if t is not None and t.requires_grad}
    result.update({"states": _grad(states_leaf), "dA_last": _grad(dA_last), "prev_states": _grad(prev_leaf),
                   "dt_state": _grad(dt_state), "dA_state": _grad(dA_state), "dt_scan": _grad(dt_scan),
                   "dA_scan": _grad(dA_scan), "CB": _grad(cb_leaf)})
    return result
