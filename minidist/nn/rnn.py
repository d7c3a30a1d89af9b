"""Recurrent layers with torch's names, parameters and shapes: ``RNN``, ``LSTM``, ``GRU``.

    lstm = nn.LSTM(input_size=10, hidden_size=20, num_layers=2, dropout=0.1)
    out, (h_n, c_n) = lstm(x)           # x (L, N, 10) -> out (L, N, 20), h_n, c_n (2, N, 20)

Each layer and direction has torch's four parameters, so a torch ``state_dict`` loads as is::

    weight_ih_l{k}[_reverse]  (G, input)      G = 4H for LSTM (gates i|f|g|o),
    weight_hh_l{k}[_reverse]  (G, H)              3H for GRU (r|z|n), H for RNN
    bias_ih_l{k}[_reverse]    (G,)
    bias_hh_l{k}[_reverse]    (G,)            all ~ U(-1/sqrt(H), 1/sqrt(H)), as torch

One time step, with ``gi = x_t W_ih^T + b_ih`` (computed for all steps in one product first)
and ``gh = h W_hh^T + b_hh``::

    RNN:   h' = tanh(gi + gh)                       (or relu)
    LSTM:  i, f, g, o = sigmoid, sigmoid, tanh, sigmoid of the four quarters of gi + gh
           c' = f * c + i * g          h' = o * tanh(c')
    GRU:   r = sigmoid(gi_r + gh_r)    z = sigmoid(gi_z + gh_z)
           n = tanh(gi_n + r * gh_n)   h' = (1 - z) * n + z * h

The loop is written with tape ops, so backpropagation through time is the tape's ordinary
backward walk. The reverse direction reads the sequence from the end; its outputs are put back
in time order and joined to the forward ones along the feature dim (forward first), which is
the next layer's input. Dropout (training mode only) applies to every layer's output but the
last, as torch.
"""

from __future__ import annotations

import math
from typing import Any

from minidist.nn import init
from minidist.nn.layers import empty_parameter, factory_dtype, place
from minidist.nn.module import Module
from minidist.tensor import Tensor, cat, dropout, linear, split, stack, zeros
from minidist.tensor.core import error

GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


def rnn_cell(x_gates: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None,
             relu: bool) -> Tensor:
    """One Elman step: ``h' = tanh(gi + h W_hh^T + b_hh)`` (or relu)."""
    pre = x_gates + linear(h, w_hh, b_hh)
    return pre.relu() if relu else pre.tanh()


def lstm_cell(x_gates: Tensor, state: tuple[Tensor, Tensor], w_hh: Tensor,
              b_hh: Tensor | None) -> tuple[Tensor, Tensor]:
    """One LSTM step; returns ``(h', c')``."""
    h, c = state
    i, f, g, o = split(x_gates + linear(h, w_hh, b_hh), h.shape[-1], -1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c.tanh(), c


def gru_cell(x_gates: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
    """One GRU step (torch's form: ``r`` multiplies ``W_hn h + b_hn``, bias included)."""
    hidden = h.shape[-1]
    xr, xz, xn = split(x_gates, hidden, -1)
    hr, hz, hn = split(linear(h, w_hh, b_hh), hidden, -1)
    r, z = (xr + hr).sigmoid(), (xz + hz).sigmoid()
    n = (xn + r * hn).tanh()
    return (1.0 - z) * n + z * h


class RNNBase(Module):
    """What RNN, LSTM and GRU share (torch's ``nn.RNNBase``): parameters, shapes, the loop.

    Args:
        mode: ``"LSTM"``, ``"GRU"``, ``"RNN_TANH"`` or ``"RNN_RELU"``.
        input_size, hidden_size: features in and out of each step.
        num_layers: stacked layers; layer k > 0 reads layer k-1's output.
        bias: the two bias vectors per layer and direction.
        batch_first: input and output are (N, L, *) instead of (L, N, *); states stay
            (layers * directions, N, H), as torch.
        dropout: dropout on each layer's output except the last (training mode only).
        bidirectional: a second pass from the end of the sequence, outputs concatenated.
        proj_size: only 0 (LSTM projections are not supported).
        device, dtype: where and in which float dtype the parameters live.
    """

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        name = type(self).__name__
        if not 0.0 <= float(dropout) <= 1.0:
            raise ValueError(error(name, f"dropout must be in [0, 1], got {dropout}."))
        if hidden_size <= 0 or num_layers <= 0:
            raise ValueError(error(name, f"hidden_size ({hidden_size}) and num_layers "
                                   f"({num_layers}) must be positive."))
        if proj_size:
            raise ValueError(error(name, f"proj_size={proj_size} is not supported; leave it 0."))
        dtype = factory_dtype(dtype)
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, 0
        gate_size = GATES[mode] * hidden_size
        directions = 2 if bidirectional else 1
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * directions
            for suffix in ("", "_reverse")[:directions]:
                setattr(self, f"weight_ih_l{layer}{suffix}",
                        empty_parameter(gate_size, layer_input, dtype=dtype))
                setattr(self, f"weight_hh_l{layer}{suffix}",
                        empty_parameter(gate_size, hidden_size, dtype=dtype))
                if bias:
                    setattr(self, f"bias_ih_l{layer}{suffix}",
                            empty_parameter(gate_size, dtype=dtype))
                    setattr(self, f"bias_hh_l{layer}{suffix}",
                            empty_parameter(gate_size, dtype=dtype))
        self.reset_parameters()
        place(self, device)

    def reset_parameters(self) -> None:
        """Every weight and bias ~ U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) (torch's)."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            init.uniform_(p, -bound, bound)

    def flatten_parameters(self) -> None:
        """torch's cuDNN weight compaction; nothing to do here (accepted for scripts)."""

    def layer_params(self, layer: int, suffix: str) -> tuple:
        """``(w_ih, w_hh, b_ih, b_hh)`` of one layer and direction (biases may be None)."""
        return tuple(getattr(self, f"{kind}_l{layer}{suffix}", None)
                     for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    def initial_states(self, hx: Any, batch: int, like: Tensor) -> list:
        """The per-(layer, direction) start states: from ``hx`` or zeros (torch's default)."""
        directions = 2 if self.bidirectional else 1
        shape = (self.num_layers * directions, batch, self.hidden_size)
        parts = hx if isinstance(hx, tuple) else (hx,)
        if hx is None:
            z = zeros(*shape, dtype=like.dtype, device=like.device)
            parts = (z, z) if self.mode == "LSTM" else (z,)
        expected = 2 if self.mode == "LSTM" else 1
        if len(parts) != expected:
            raise ValueError(error(type(self).__name__, f"expected {expected} initial state "
                                   f"tensor(s), got {len(parts)}. LSTM takes (h_0, c_0)."))
        parts = tuple(p if isinstance(p, Tensor) else Tensor(p) for p in parts)
        for p in parts:
            if tuple(p.shape) != shape:
                raise ValueError(error(type(self).__name__, f"initial state must have shape "
                                       f"{shape} (num_layers * directions, batch, hidden), got "
                                       f"{tuple(p.shape)}."))
        states = []
        for k in range(shape[0]):
            states.append(tuple(p[k] for p in parts) if expected == 2 else parts[0][k])
        return states

    def run_direction(self, x: Tensor, state: Any, layer: int, suffix: str) -> tuple:
        """One layer in one direction over the whole sequence x (L, N, in): (outputs, state)."""
        w_ih, w_hh, b_ih, b_hh = self.layer_params(layer, suffix)
        steps = range(x.shape[0] - 1, -1, -1) if suffix else range(x.shape[0])
        x_gates = linear(x, w_ih, b_ih)  # (L, N, G): the input half of every step at once
        outputs: list[Any] = [None] * x.shape[0]
        for t in steps:
            if self.mode == "LSTM":
                state = lstm_cell(x_gates[t], state, w_hh, b_hh)
                outputs[t] = state[0]
            elif self.mode == "GRU":
                state = outputs[t] = gru_cell(x_gates[t], state, w_hh, b_hh)
            else:
                state = outputs[t] = rnn_cell(x_gates[t], state, w_hh, b_hh,
                                              self.mode == "RNN_RELU")
        return stack(outputs, 0), state

    def forward(self, input: Tensor, hx: Any = None) -> tuple:  # noqa: A002 - torch's name
        """Run the stack over ``input``; returns ``(output, h_n)`` (LSTM: ``(h_n, c_n)``).

        Args:
            input: (L, N, input_size), or (N, L, input_size) with ``batch_first``, or
                (L, input_size) unbatched.
            hx: the initial state(s), (num_layers * directions, N, hidden_size) each
                (without the N dim when unbatched); zeros when None.
        """
        x = input if isinstance(input, Tensor) else Tensor(input)
        name = type(self).__name__
        if x.ndim not in (2, 3) or x.shape[-1] != self.input_size:
            raise ValueError(error(name, f"expected input of shape (L, N, {self.input_size}) "
                                   f"(or (N, L, {self.input_size}) with batch_first, or "
                                   f"(L, {self.input_size}) unbatched), got {x.shape}."))
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(1)
            if hx is not None:
                hx = tuple(h.unsqueeze(1) for h in hx) if isinstance(hx, tuple) \
                    else hx.unsqueeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        states = self.initial_states(hx, x.shape[1], x)
        finals = []
        directions = ("", "_reverse") if self.bidirectional else ("",)
        for layer in range(self.num_layers):
            outs = []
            for d, suffix in enumerate(directions):
                out, state = self.run_direction(x, states[layer * len(directions) + d],
                                                layer, suffix)
                outs.append(out)
                finals.append(state)
            x = outs[0] if len(outs) == 1 else cat(outs, 2)
            if self.dropout and layer < self.num_layers - 1:
                x = dropout(x, self.dropout, self.training)
        if unbatched:
            x = x.squeeze(1)
        elif self.batch_first:
            x = x.transpose(0, 1)
        if self.mode == "LSTM":
            h_n, c_n = (stack([s[i] for s in finals], 0) for i in (0, 1))
            return x, ((h_n.squeeze(1), c_n.squeeze(1)) if unbatched else (h_n, c_n))
        h_n = stack(finals, 0)
        return x, (h_n.squeeze(1) if unbatched else h_n)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s


class RNN(RNNBase):
    """torch's ``nn.RNN(input_size, hidden_size, num_layers=1, nonlinearity='tanh', bias=True,
    batch_first=False, dropout=0.0, bidirectional=False, device=None, dtype=None)``.

    >>> import minidist
    >>> from minidist import nn
    >>> rnn = nn.RNN(4, 8, num_layers=2, batch_first=True)
    >>> out, h_n = rnn(minidist.randn(3, 5, 4))
    >>> out.shape, h_n.shape
    ((3, 5, 8), (2, 3, 8))
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device: Any = None,
                 dtype: Any = None) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(error("RNN", f"nonlinearity must be 'tanh' or 'relu', got "
                                   f"{nonlinearity!r}."))
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", input_size,
                         hidden_size, num_layers, bias, batch_first, dropout, bidirectional,
                         device=device, dtype=dtype)


class LSTM(RNNBase):
    """torch's ``nn.LSTM(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False, proj_size=0, device=None, dtype=None)``; the state is
    the pair ``(h, c)``.

    >>> import minidist
    >>> from minidist import nn
    >>> lstm = nn.LSTM(4, 8, num_layers=2, bidirectional=True)
    >>> out, (h_n, c_n) = lstm(minidist.randn(5, 3, 4))
    >>> out.shape, h_n.shape, c_n.shape
    ((5, 3, 16), (4, 3, 8), (4, 3, 8))
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """torch's ``nn.GRU(input_size, hidden_size, num_layers=1, bias=True, batch_first=False,
    dropout=0.0, bidirectional=False, device=None, dtype=None)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("GRU", *args, **kwargs)
