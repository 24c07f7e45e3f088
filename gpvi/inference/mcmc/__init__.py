"""NUTS/HMC baseline over the same log joint (NumPy transitions, or NUTS's trees compiled with numba when it is
installed, the same draws; one gradient call per leapfrog step).

=====================  ======================================================================================
:mod:`.nuts`           :class:`NUTS` (and the model: Hamiltonian, leapfrog, dual averaging)
:mod:`.hmc`            :class:`HMC` (fixed trajectory length)
:mod:`.engine`         what both share: settings, start, run over chains, resume, result
:mod:`.settings`       :class:`Adaptation` (warm-up) and :class:`ConvergenceChecks` (end-of-run warnings)
:mod:`.starts`         chain starts from an init strategy's ``Start``; :class:`init_to_chains`
:mod:`.kernel`         one transition: leapfrog, multinomial NUTS, fixed-length HMC, step-size search
:mod:`.trees`          NUTS transitions of all chains in one compiled call a round (numba; the kernel's, bit for bit)
:mod:`.adaptation`     warm-up: dual averaging, Stan's windows, regularised (co)variance
:mod:`.chains`         the per-chain loop: warm-up, frozen sampling, snapshots for resume
:mod:`.state`          :class:`MCMCState`, :class:`ChainState`
:mod:`.diagnostics`    divergences, E-BFMI, per-chain table, convergence warnings (ESS and split R-hat:
                       :mod:`gpvi.posteriors.diagnostics`)
=====================  ======================================================================================
"""

from .hmc import HMC
from .nuts import NUTS
from .settings import Adaptation, ConvergenceChecks
from .starts import init_to_chains
from .state import ChainState, MCMCState

__all__ = ["HMC", "NUTS", "Adaptation", "ConvergenceChecks", "ChainState", "MCMCState", "init_to_chains"]
