"""The solver shape shared by every cuscikit system, after PySCF's ``lib.StreamObject``.

- Options are class attributes with their defaults; an instance overrides them by plain
  assignment (``solver.conv_tol = 1e-12``), by keywords to the constructor or with `set`.
- `kernel` computes and stores the main results as attributes (``e_tot``, ``converged``, ...)
  and returns them; `run` calls `kernel` and returns the solver, for chaining.
- `check_sanity` (called by `kernel` before any work) rejects an attribute that is neither an
  option nor a declared result (``_keys``): a misspelt option is an error, not a silent no-op.
- `dump_flags` logs the options at ``verbose >= INFO``.

Example (the error lists every option after "options:"):
    >>> class Toy(Solver):
    ...     conv_tol = 1e-9
    ...     max_cycle = 50
    ...     _keys = {"e_tot"}
    ...     def kernel(self):
    ...         self.check_sanity()
    ...         self.e_tot = -1.0
    ...         return self.e_tot
    >>> Toy(max_cycle=10).run().e_tot
    -1.0
    >>> t = Toy()
    >>> t.conv_tl = 1e-12        # a typo
    >>> t.kernel()
    Traceback (most recent call last):
        ...
    AttributeError: Toy has no option 'conv_tl' (did you mean 'conv_tol'?); options: ...
"""

from __future__ import annotations

import difflib
import inspect

from cuscikit.lib.logger import INFO, NOTE, new_logger


class Solver:
    """Base class: options as class attributes, results as attributes after `kernel`."""

    verbose: int = NOTE
    _keys: frozenset[str] | set[str] = frozenset()

    def __init__(self, **options):
        self.set(**options)

    # --- options ---------------------------------------------------------------------------------
    @classmethod
    def option_names(cls) -> list[str]:
        """The public, non-callable class attributes over the MRO: the solver's options."""
        names: dict[str, None] = {}
        for klass in cls.__mro__:
            if klass is object:
                continue
            for name, value in vars(klass).items():
                if name.startswith("_") or name in names:
                    continue
                if callable(value) or isinstance(value, (property, classmethod, staticmethod)):
                    continue
                if inspect.isdatadescriptor(value):
                    continue
                names[name] = None
        declared = cls._declared_keys()
        return sorted(n for n in names if n not in declared)

    @classmethod
    def _declared_keys(cls) -> set[str]:
        keys: set[str] = set()
        for klass in cls.__mro__:
            keys |= set(vars(klass).get("_keys", ()))
        return keys

    @classmethod
    def _known(cls) -> set[str]:
        known = cls._declared_keys()
        for klass in cls.__mro__:
            known |= set(vars(klass))
        return known

    def options(self) -> dict:
        """The current value of every option."""
        return {name: getattr(self, name) for name in self.option_names()}

    def _unknown_error(self, name: str) -> AttributeError:
        options = self.option_names()
        close = difflib.get_close_matches(name, options + sorted(self._declared_keys()), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return AttributeError(
            f"{type(self).__name__} has no option {name!r}{hint}; options: {', '.join(options)}"
        )

    def set(self, **options) -> Solver:
        """Set options by keyword (anything else, a method say, raises AttributeError);
        returns the solver."""
        allowed = set(self.option_names()) | self._declared_keys()
        for name, value in options.items():
            if name not in allowed:
                raise self._unknown_error(name)
            setattr(self, name, value)
        return self

    def check_sanity(self) -> Solver:
        """Raise AttributeError for an instance attribute that is neither an option nor a
        declared result (a misspelt option); private names (``_x``) are always allowed."""
        known = self._known()
        for name in vars(self):
            if not name.startswith("_") and name not in known:
                raise self._unknown_error(name)
        return self

    def dump_flags(self, verbose: int | None = None) -> Solver:
        """Log the options (at ``verbose >= INFO``, PySCF's convention)."""
        log = new_logger(self, verbose=verbose)
        if log.verbose < INFO:
            return self
        log.info("******** %s ********", type(self).__name__)
        for name, value in self.options().items():
            log.info("%s = %s", name, value)
        return self

    # --- running ---------------------------------------------------------------------------------
    def kernel(self, *args, **kwargs):
        raise NotImplementedError

    def run(self, *args, **kwargs) -> Solver:
        """`kernel` with the same arguments; returns the solver (``Solver(...).run().e_tot``)."""
        self.kernel(*args, **kwargs)
        return self

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.options().items() if k != "verbose")
        return f"{type(self).__name__}({shown})"
