"""Neural-network quantum states: the autoregressive transformer wavefunction and the NNQS-SCI
runner. PyTorch is imported when one of these names is first used, so the rest of cuscikit
(e.g. `cuscikit.nnqs.defaults`) works without it."""

_EXPORTS = {
    "Ansatz": "cuscikit.nnqs.ansatz",
    "Runner": "cuscikit.nnqs.runner",
    "LearningRateDecay": "cuscikit.nnqs.runner",
    "NonFiniteLossError": "cuscikit.nnqs.runner",
    "Callback": "cuscikit.lib.callbacks",
    "EarlyStopping": "cuscikit.lib.callbacks",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'cuscikit.nnqs' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_EXPORTS))


__all__ = list(_EXPORTS)
