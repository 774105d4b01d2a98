"""Floating-point operations a transformer actually executes, whatever caching scheme is applied.

    with TransformerFlops(gen.transformer) as fl:
        sample(gen, prompts, 20, callbacks=[...])
    fl.flops        # multiply-adds x 2 over every transformer call of the run (MLPs, norms, attention, ...)
    fl.calls        # transformer calls made (a skipped call counts as a call with ~0 FLOPs)

Counted with :class:`torch.utils.flop_counter.FlopCounterMode`, entered around each call of the
transformer only (a forward pre-hook and hook on the transformer, so text encoders and VAEs are not
counted, and a cache that replaces the transformer's forward or skips its blocks is counted by what it
ran). FlopCounterMode counts matrix products and convolutions (elementwise ops and norms are below its
resolution: they are a small share of a transformer's FLOPs). Its table has no entry for the fused CPU
attention kernel ``aten._scaled_dot_product_flash_attention_for_cpu`` (torch 2.13), which
``F.scaled_dot_product_attention`` uses on CPU: that op is added here with the same formula torch uses for
the GPU kernels (``2 * B * H * Sq * Sk * (D + Dv)``, two batched products); a masked call that falls back
to the math path is decomposed into matmuls torch counts itself.
"""
from contextlib import ExitStack

from torch.utils import flop_counter as _fc

from ..core.compat import cpu_sdpa_op
from ..core.hooks import forward_hooks


def _sdpa_cpu_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return _fc.sdpa_flop_count(query_shape, key_shape, value_shape)


def flop_counter() -> _fc.FlopCounterMode:
    """A FlopCounterMode (no printed table) that also counts CPU fused attention."""
    op = cpu_sdpa_op()
    return _fc.FlopCounterMode(display=False, custom_mapping={op: _sdpa_cpu_flops} if op is not None and
                               op not in _fc.flop_registry else {})


class TransformerFlops:
    """Context manager: FLOPs of every call of ``transformer`` (a module, or a Generator's) while open.
    ``flops`` (int, total), ``calls`` (forward calls seen), ``per_call`` (list of each call's FLOPs).
    Hooks are removed on exit, also on error (a call that raised is counted up to where it failed)."""

    def __init__(self, transformer):
        self.transformer = getattr(transformer, "transformer", transformer)
        self.flops, self.calls, self._mode = 0, 0, None
        self.per_call: list[int] = []
        self._stack = ExitStack()

    def _pre(self, module, args, kwargs):
        if self._mode is not None:  # a re-entrant call (the model calling itself): counted by the outer call
            self._depth += 1
            return
        self._depth = 0
        self._mode = flop_counter()
        self._mode.__enter__()

    def _post(self, module, args, kwargs, output):
        if self._mode is None:
            return
        if self._depth:
            self._depth -= 1
            return
        self._close()

    def _close(self):
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        n = int(mode.get_total_flops())
        self.flops += n
        self.calls += 1
        self.per_call.append(n)

    def __enter__(self):
        self._stack.enter_context(forward_hooks([(self.transformer, "forward_pre", self._pre),
                                                 (self.transformer, "forward", self._post)]))
        return self

    def __exit__(self, *exc):
        self._stack.close()
        if self._mode is not None:  # a call that raised never reached the forward hook
            self._close()
        return False
