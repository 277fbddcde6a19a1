"""A stack of pre-norm residual layers: the skeleton shared by the Mamba and LRU backbones.

    z^0_t = W_in x_t + b_in,
    z^l_t = z^{l-1}_t + f_l(RMSNorm_l(z^{l-1})_{1:t}),     l = 1, ..., L,
    h_t = RMSNorm_out(z^L_t),

with ``RMSNorm(v) = w * v / sqrt(mean(v^2) + eps)`` and ``f_l`` a causal sequence layer
with a per-layer state (a diagonal linear recurrence in `statseq.models.neural.mamba` and
`statseq.models.neural.lru`). A subclass supplies one layer: its parameter shapes, random
initialization, initial state, one step (generation mode) and a whole-sequence form
(training mode) that must give the same outputs and final state as repeated steps. The
per-layer parameters and states are stacked along a leading ``num_layers`` axis and the
layers run as a `jax.lax.scan` over that axis (one traced layer however deep the stack).

**Whole-sequence evaluation** (``evaluation=``, as the recurrent cells' `RNNBackbone`). A
layer whose recurrence is linear in its state given the inputs,

    h_t = a_t * h_{t-1} + u_t      (a_t, u_t functions of the layer's inputs only),

is evaluated by its own linear-recurrence scan: an associative scan (``parallel=True``),
a `jax.lax.scan` (``parallel=False`` or ``evaluation="sequential"``) or by backend
(``parallel=None``, ``evaluation=None``). ``evaluation="deer"``, ``"quasi-deer"``, ``"elk"``
or ``"quasi-elk"`` instead hand the recurrence to the generic parallel Newton solver
(`statseq.models.neural.evaluation.evaluate_layer`, layer after layer, with its
sequential fallback and warning). The Jacobian ``∂h_t/∂h_{t-1}`` of a linear recurrence is
its own multiplier ``a_t``, whatever the guess, so DEER's linearization is the recurrence
itself and its first iterate from the zero guess, ``h_t = a_t h_{t-1} + u_t`` by an
associative scan, *is* the associative scan: DEER (and quasi-DEER where ``a_t`` is
diagonal in the solver's real coordinates) converges after one Newton step, the second
evaluation of the residual only confirming it. A subclass opts in by splitting its layer
at the recurrence (`ResidualStack.layer_recurrence_inputs`, `layer_recurrence_step`,
`layer_recurrence_outputs`).
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from numpyro.distributions import constraints

from statseq.core.validation import check_positive_int, float_dtype
from statseq.models.neural.base import Backbone, NeuralSequenceModel
from statseq.models.neural.evaluation import check_evaluation, evaluate_layer

#: Added to the mean square in `rms_norm`.
RMS_EPS = 1e-5


class StackParams(NamedTuple):
    """Parameters of a `ResidualStack`.

    Attributes:
        embed_weight: ``(input_dim, hidden_dim)`` input projection ``W_in`` (``x @ W``).
        embed_bias: ``(hidden_dim,)``.
        norm: ``(num_layers, hidden_dim)`` pre-norm scales, one row per layer.
        layers: the layer's parameter NamedTuple, every leaf with a leading
            ``num_layers`` axis.
        final_norm: ``(hidden_dim,)`` scale of the output RMSNorm.
    """

    embed_weight: jax.Array
    embed_bias: jax.Array
    norm: jax.Array
    layers: Any
    final_norm: jax.Array


def rms_norm(x, weight, eps: float = RMS_EPS):
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis."""
    return weight * x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


def _is_shape(x) -> bool:
    return isinstance(x, tuple) and all(isinstance(i, int) for i in x)


def dense_init(key, shape, fan_in: int, dtype):
    """Uniform ``(-1/sqrt(fan_in), 1/sqrt(fan_in))`` weights (PyTorch's ``nn.Linear``)."""
    bound = 1.0 / jnp.sqrt(jnp.asarray(fan_in, dtype))
    return jax.random.uniform(key, shape, dtype, -bound, bound)


def check_mode(mode, parallel, evaluation, *, modes: tuple, name: str,
               parallel_modes: tuple, evaluation_max_iter=None) -> None:
    """The one ``mode`` check of the backbones with whole-sequence modes (S4D, S5,
    LinearAttention, AFT, RWKV, mLSTM, WaveNet): their `ResidualStack` fields ``parallel``
    and ``evaluation`` are older switches for the same choice, and no Newton solver applies.

    ``evaluation="sequential"`` and ``parallel=False`` mean ``mode="recurrent"``;
    ``parallel=True`` means one of ``parallel_modes`` (the model's non-recurrent forms that
    ``parallel=True`` stands for). A ``mode`` outside what they mean is a contradiction.

    Args:
        mode: the field ``mode`` (``None`` or one of ``modes``).
        parallel: the field ``parallel`` (``None``, ``True`` or ``False``).
        evaluation: the field ``evaluation`` (``None`` or ``"sequential"``).
        modes: the model's modes (``"recurrent"`` among them).
        name: the model's name, for the messages.
        parallel_modes: the modes ``parallel=True`` allows.
        evaluation_max_iter: the field ``evaluation_max_iter`` where the model refuses it
            (it has no solver to limit); ``None`` otherwise.

    Raises:
        ValueError: an unknown ``mode``, a Newton ``evaluation`` (or a max_iter), or a
            ``mode`` contradicting ``parallel`` / ``evaluation``, each naming the fields.

    Examples:
        >>> check_mode("chunked", True, None, modes=("recurrent", "parallel", "chunked"),
        ...            name="RWKV", parallel_modes=("parallel", "chunked"))
        >>> try:
        ...     check_mode("recurrent", True, None, modes=("recurrent", "scan"), name="S4D",
        ...                parallel_modes=("scan",))
        ... except ValueError as err:
        ...     print(str(err)[:50])
        S4D: mode='recurrent' contradicts parallel=True, e
    """
    if mode is not None and mode not in modes:
        raise ValueError(f"{name}: mode must be None or one of {modes}, got {mode!r}")
    if evaluation not in (None, "sequential") or evaluation_max_iter is not None:
        raise ValueError(
            f"{name} has no parallel Newton evaluation: evaluation must be None or "
            f"'sequential' (and evaluation_max_iter None), got evaluation={evaluation!r}, "
            f"evaluation_max_iter={evaluation_max_iter!r}; choose mode= (one of {modes})")
    if evaluation == "sequential" and parallel:
        raise ValueError(f"{name}: evaluation='sequential' (the recurrence) contradicts "
                         "parallel=True: pass mode only")
    implied = (("recurrent",) if evaluation == "sequential" or parallel is False
               else tuple(parallel_modes) if parallel else None)
    if mode is not None and implied is not None and mode not in implied:
        raise ValueError(f"{name}: mode={mode!r} contradicts parallel={parallel}, "
                         f"evaluation={evaluation!r} (which mean mode in {implied}): "
                         "pass mode only")


def resolve_mode(mode, parallel, evaluation, *, when_parallel, default) -> str:
    """The mode a whole sequence runs in: ``mode``; else ``"recurrent"`` for
    ``parallel=False`` / ``evaluation="sequential"``; else ``when_parallel`` for
    ``parallel=True``; else ``default`` (the backend/length rule).

    Args:
        mode: the field ``mode``.
        parallel: the field ``parallel``.
        evaluation: the field ``evaluation``.
        when_parallel: the mode ``parallel=True`` gives, or a function of no arguments
            returning it (called only then).
        default: the mode ``mode=None`` gives, or a function of no arguments returning it.

    Returns:
        The mode's name.

    Examples:
        >>> resolve_mode(None, False, None, when_parallel="scan", default="convolution")
        'recurrent'
    """
    if mode is not None:
        return mode
    if parallel is False or evaluation == "sequential":
        return "recurrent"
    choice = when_parallel if parallel else default
    return choice() if callable(choice) else choice


@dataclasses.dataclass(frozen=True)
class ResidualStack(Backbone):
    """Backbone of ``num_layers`` pre-norm residual layers of width ``hidden_dim``.

        z^0_t = W_in x_t + b_in,  z^l = z^{l-1} + f_l(RMSNorm(z^{l-1})),  h_t = RMSNorm(z^L_t).

    Subclasses implement the layer hooks (``layer_*``); ``output_dim == hidden_dim``.

    Args:
        input_dim: size of ``x_t``.
        hidden_dim: the model width ``d``.
        num_layers: number of residual layers ``L``.
        parallel: whole sequences by an associative scan (``True``), ``lax.scan``
            (``False``) or by backend (``None``: sequential on CPU).
        evaluation: ``None`` (the layer's own scan, as ``parallel`` says), ``"sequential"``
            (``lax.scan``, the same as ``parallel=False``) or a parallel Newton solver on
            the layers' recurrences (``"deer"``, ``"quasi-deer"``, ``"elk"``,
            ``"quasi-elk"``; module docstring). ``parallel`` and ``evaluation`` choose the
            same thing: a Newton method needs ``parallel=None``, ``"sequential"`` refuses
            ``parallel=True``.
        evaluation_max_iter: the solver's maximum number of iterations (default ``T``).

    Raises:
        ValueError: for an unknown ``evaluation``, a bad ``evaluation_max_iter`` or an
            ``evaluation`` that contradicts ``parallel``.
    """

    input_dim: int
    hidden_dim: int
    num_layers: int = 1
    parallel: bool | None = None
    evaluation: str | None = None
    evaluation_max_iter: int | None = None

    def __post_init__(self):
        check_positive_int(self.input_dim, "input_dim")
        check_positive_int(self.hidden_dim, "hidden_dim")
        check_positive_int(self.num_layers, "num_layers")
        if self.parallel is not None and not isinstance(self.parallel, bool):
            raise TypeError(f"parallel must be True, False or None, got {self.parallel!r}")
        check_evaluation(self.evaluation, self.evaluation_max_iter)
        if self.evaluation == "sequential" and self.parallel:
            raise ValueError("evaluation='sequential' (lax.scan) contradicts parallel=True "
                             "(the associative scan): pass one of them")
        if self.evaluation not in (None, "sequential") and self.parallel is not None:
            raise ValueError(
                f"evaluation={self.evaluation!r} (parallel Newton iterations) and "
                f"parallel={self.parallel} (the layer's own associative scan or lax.scan) "
                "choose the same thing: leave parallel=None")

    @property
    def newton_method(self) -> str | None:
        """The parallel Newton solver that evaluates whole sequences, or ``None`` for the
        layers' own linear-recurrence scan (`recurrence_parallel`)."""
        return None if self.evaluation in (None, "sequential") else self.evaluation

    @property
    def recurrence_parallel(self) -> bool | None:
        """``parallel`` of the layers' own scan: ``False`` for ``evaluation="sequential"``."""
        return False if self.evaluation == "sequential" else self.parallel

    # ---- one layer (subclass hooks) --------------------------------------------------
    @abc.abstractmethod
    def layer_param_shapes(self) -> Any:
        """The layer's parameter NamedTuple of shape tuples (without the layer axis)."""

    @abc.abstractmethod
    def layer_init(self, key, dtype) -> Any:
        """Random parameters of one layer."""

    @abc.abstractmethod
    def layer_initial_state(self, layer_params) -> Any:
        """The state of one layer before any input."""

    @abc.abstractmethod
    def layer_step(self, layer_params, state, x_t):
        """One step: normalized input ``(hidden_dim,)`` -> ``(new_state, f(x)_t)``."""

    @abc.abstractmethod
    def layer_scan(self, layer_params, state, xs):
        """A whole sequence ``(T, hidden_dim)`` -> ``(final_state, outputs (T, hidden_dim))``."""

    # ---- one layer split at its recurrence (for the Newton solvers) ------------------
    def layer_recurrence_inputs(self, layer_params, state, xs):
        """Everything before the recurrence: ``(h0, us, aux)`` with ``h0`` the real
        recurrent state before the first step, ``us`` ``(T, P)`` the per-step inputs of
        `layer_recurrence_step` and ``aux`` what `layer_recurrence_outputs` needs."""
        raise NotImplementedError(f"{type(self).__name__} has no parallel Newton "
                                  "evaluation: use evaluation=None or 'sequential'")

    def layer_recurrence_step(self, layer_params, h, u_t):
        """The recurrence, ``h_t = step(layer_params, h_{t-1}, u_t)`` (real ``h``)."""
        raise NotImplementedError

    def layer_recurrence_outputs(self, layer_params, state, xs, hs, aux):
        """Everything after the recurrence: ``(final_state, outputs (T, hidden_dim))``
        from the states ``hs`` (leading time axis ``T``)."""
        raise NotImplementedError

    def _layer_newton(self, layer_params, state, xs):
        """`layer_scan` with the recurrence solved by `evaluate_layer` (the Newton method
        `newton_method`, sequential fallback). ``xs`` ``(T, d)`` with the layer's state, or
        a time-major batch ``(T, N, d)`` with state leaves ``(N, ...)``: the solver then
        runs on the whole batch (one convergence test, so that only the taken branch of
        the fallback runs)."""
        method, max_iter = self.newton_method, self.evaluation_max_iter
        if xs.ndim == 2:
            h0, us, aux = self.layer_recurrence_inputs(layer_params, state, xs)
            hs = evaluate_layer(self.layer_recurrence_step, layer_params, h0, us,
                                method=method, max_iter=max_iter)
            return self.layer_recurrence_outputs(layer_params, state, xs, hs, aux)
        h0, us, aux = jax.vmap(self.layer_recurrence_inputs, (None, 0, 1), (0, 1, 0))(
            layer_params, state, xs)
        hs = evaluate_layer(self.layer_recurrence_step, layer_params, h0, us, method=method,
                            max_iter=max_iter)  # time-major (T, N, ...)
        return jax.vmap(self.layer_recurrence_outputs, (None, 0, 1, 1, 0), (0, 1))(
            layer_params, state, xs, hs, aux)

    # ---- the stack -------------------------------------------------------------------
    @property
    def output_dim(self) -> int:
        return self.hidden_dim

    def param_shapes(self) -> StackParams:
        d, n = self.hidden_dim, self.num_layers
        layers = jax.tree.map(lambda s: (n,) + s, self.layer_param_shapes(), is_leaf=_is_shape)
        return StackParams((self.input_dim, d), (d,), (n, d), layers, (d,))

    def param_constraints(self) -> StackParams:
        return jax.tree.map(lambda _: constraints.real, self.param_shapes(), is_leaf=_is_shape)

    def init_params(self, key, dtype=None) -> StackParams:
        dtype = float_dtype() if dtype is None else dtype
        d, n = self.hidden_dim, self.num_layers
        k_embed, k_layers = jax.random.split(key)
        layers = [self.layer_init(k, dtype) for k in jax.random.split(k_layers, n)]
        return StackParams(
            embed_weight=dense_init(k_embed, (self.input_dim, d), self.input_dim, dtype),
            embed_bias=jnp.zeros((d,), dtype),
            norm=jnp.ones((n, d), dtype),
            layers=jax.tree.map(lambda *xs: jnp.stack(xs), *layers),
            final_norm=jnp.ones((d,), dtype),
        )

    def initial_state(self, params):
        return jax.vmap(self.layer_initial_state)(params.layers)

    def _run(self, layer_fn, params, state, x):
        """Embed ``x``, run the residual layers (scanned over depth), normalize."""
        z = x @ params.embed_weight + params.embed_bias

        def layer(z, xs):
            norm, layer_params, s = xs
            s, out = layer_fn(layer_params, s, rms_norm(z, norm))
            return z + out, s

        z, state = jax.lax.scan(layer, z, (params.norm, params.layers, state))
        return state, rms_norm(z, params.final_norm)

    def step(self, params, state, x_t):
        return self._run(self.layer_step, params, state, x_t)

    def scan(self, params, state, xs):
        """A whole sequence ``xs`` ``(T, input_dim)``: every layer by its own scan, or by
        the Newton solver `newton_method` (module docstring)."""
        layer_fn = self.layer_scan if self.newton_method is None else self._layer_newton
        return self._run(layer_fn, params, state, xs)

    def scan_time_major(self, params, state, xs):
        """A time-major batch ``xs`` ``(T, N, input_dim)``, state leaves ``(N, L, ...)``:
        `scan` vmapped over the sequences, or with a Newton solver the whole batch layer
        after layer (`_layer_newton`)."""
        if self.newton_method is None:
            return super().scan_time_major(params, state, xs)
        swap = lambda tree: jax.tree.map(lambda v: jnp.swapaxes(v, 0, 1), tree)  # noqa: E731
        final, hs = self._run(self._layer_newton, params, swap(state), xs)
        return swap(final), hs


class StackedBackboneModel:
    """Mixin for a `NeuralSequenceModel` whose features are the ``hidden_dim`` outputs of
    a ``num_layers``-deep ``backbone`` property: checks both fields, runs the base model's
    checks, then builds the backbone once so that its own checks fail at construction.

    Put it before `NeuralSequenceModel` in the bases (``class M(StackedBackboneModel,
    NeuralSequenceModel)``); it declares no dataclass fields, so the model's fields keep
    their order.
    """

    def __post_init__(self):
        check_positive_int(self.hidden_dim, "hidden_dim")
        check_positive_int(self.num_layers, "num_layers")
        super().__post_init__()
        self.backbone  # noqa: B018 - validates the architecture fields eagerly

    @property
    def feature_dim(self) -> int:
        return self.hidden_dim


@dataclasses.dataclass(frozen=True)
class ResidualStackModel(StackedBackboneModel, NeuralSequenceModel):
    """Fields and checks shared by the models built on a `ResidualStack` (Mamba, LRU).

    Args:
        hidden_dim: model width ``d`` (the features the head reads).
        state_dim: state size ``N`` of each layer's recurrence.
        num_layers: number of stacked layers.
    """

    hidden_dim: int = 16
    state_dim: int = 16
    num_layers: int = 2

