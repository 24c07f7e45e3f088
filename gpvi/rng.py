"""Explicit randomness: every stochastic routine takes ``seed`` or ``generator``; none touches global RNG state."""

from __future__ import annotations

import numbers

import numpy as np
import torch

__all__ = ["check_seed", "check_random_state", "resolve_generator", "generator_from_state", "copy_generator", "randn"]


def check_seed(seed: object, name: str = "seed", *, allow_none: bool = True) -> int | None:
    """The one check of a seed argument: a non-negative int, or None (a fresh, non-deterministic stream).

    Every engine and model that takes a seed calls this in its constructor, so a bad seed fails at construction,
    not at ``run``. numpy integers are accepted.

    Raises
    ------
    TypeError
        Naming ``name``: not an int (a float such as 1.5 or 2.0, a string, a boolean), or None when
        ``allow_none`` is False.
    ValueError
        Naming ``name``: a negative int.
    """
    if seed is None and allow_none:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        none = " or None" if allow_none else ""
        raise TypeError(f"{name} must be a non-negative int{none}; got {seed!r} of type {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"{name} must be a non-negative int; got {seed}")
    return int(seed)


def check_random_state(random_state: object, name: str = "random_state") -> int | None:
    """A scikit-learn ``random_state`` as a seed for :func:`resolve_generator`.

    Parameters
    ----------
    random_state : int, numpy.random.RandomState or None
        An int or None as :func:`check_seed` takes them (None: a fresh, non-deterministic stream). A
        ``numpy.random.RandomState`` gives one seed drawn from it, ``randint(2**31 - 1)``, which advances it
        (scikit-learn's convention, ``sklearn.utils.check_random_state``): two objects in the same state give the same
        seed, and two fits sharing one object get different seeds.
    name : str
        The argument's name in error messages.

    Returns
    -------
    int or None

    Raises
    ------
    TypeError
        Naming ``name``: anything else (a ``numpy.random.Generator``, a float, a string, a boolean).
    ValueError
        Naming ``name``: a negative int.
    """
    if isinstance(random_state, np.random.RandomState):
        return int(random_state.randint(np.iinfo(np.int32).max))
    if random_state is None or (isinstance(random_state, numbers.Integral) and not isinstance(random_state, bool)):
        return check_seed(random_state, name)
    raise TypeError(f"{name} must be a non-negative int, a numpy.random.RandomState or None; got {random_state!r} of "
                    f"type {type(random_state).__name__}")


def resolve_generator(
    seed: int | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Generator:
    """Return the ``torch.Generator`` a stochastic routine should draw from.

    Parameters
    ----------
    seed : int or None
        Seed for a fresh generator. Ignored when ``generator`` is given.
    generator : torch.Generator or None
        Used as is (and advanced) when given.
    device : torch.device, str or None
        Device of a freshly created generator (CPU by default).

    Returns
    -------
    torch.Generator
        ``generator`` if given; else a new generator seeded with ``seed``; else a new generator with a
        non-deterministic seed (the global RNG is never read or advanced).

    Raises
    ------
    TypeError
        ``seed`` is not an int or ``generator`` is not a ``torch.Generator``.
    ValueError
        ``seed`` is negative.
    """
    if generator is not None:
        if not isinstance(generator, torch.Generator):
            raise TypeError(f"generator must be a torch.Generator; got {type(generator).__name__}")
        return generator
    dev = torch.device(device) if device is not None else torch.device("cpu")
    gen = torch.Generator(device=dev)
    if seed is None:
        gen.seed()
        return gen
    gen.manual_seed(check_seed(seed))
    return gen


def generator_from_state(state: dict) -> torch.Generator:
    """A new generator in the state saved under ``"generator_state"`` (on the device ``"generator_device"``) of an
    engine's ``state_dict`` — the inverse of storing ``gen.get_state()`` and ``str(gen.device)``."""
    gen = torch.Generator(device=state["generator_device"])
    gen.set_state(state["generator_state"])
    return gen


def copy_generator(generator: torch.Generator) -> torch.Generator:
    """A new generator in ``generator``'s state: drawing from the copy leaves ``generator`` where it was."""
    gen = torch.Generator(device=generator.device)
    gen.set_state(generator.get_state())
    return gen


def randn(shape: tuple[int, ...], generator: torch.Generator | None, *, dtype: torch.dtype = torch.float64,
          device: torch.device | str | None = None) -> torch.Tensor:
    """Standard normals of ``shape`` drawn where ``generator`` lives (the CPU without one), then moved to
    ``device`` (``None``: left there). One seed gives one stream whatever the data's device, and a CPU generator
    serves CUDA data (``torch.randn`` refuses a generator on another device)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None; got {type(generator).__name__}")
    z = torch.randn(shape, generator=generator, dtype=dtype,
                    device=generator.device if generator is not None else torch.device("cpu"))
    return z if device is None else z.to(device)
