"""Neural-network quantum states: the autoregressive transformer wavefunction."""

from cuscikit.nnqs.ansatz import Ansatz
from cuscikit.nnqs.runner import Callback, EarlyStopping, Runner

__all__ = ["Ansatz", "Callback", "EarlyStopping", "Runner"]
