r"""The NUTS transition of :func:`~gpvi.inference.mcmc.kernel.nuts_transition` compiled with numba, for every
chain of a round in one call (:mod:`gpvi.inference.mcmc.trees` drives it; imported only when numba is installed).

The recursion of the NumPy kernel becomes a state machine: a subtree of depth j is a binary counter of its
:math:`2^j` leaves, and after leaf k the halves waiting on a stack (slot ``1 + l`` holds level l's first half)
merge with the new node as many times as k has trailing ones, which is the order of the recursion's merges and
uniform draws. Every number is computed with the same operations in the same order as the NumPy kernel (the
kinetic energies with BLAS, as ``r @ ps``; the acceptance statistic summed in the tree's order, :func:`_fold`), so
its transitions are the NumPy kernel's bit for bit (``tests/inference/mcmc/test_trees.py``). Only the no-U-turn
checks' dot products are summed in another order; they decide a sign, not a value.

Per chain ``c``: ``nd[c, slot, field, :]`` the nodes (slot 0 the trajectory, 1..max_depth the waiting halves, then
a scratch slot and the new leaf), ``sc[c, slot]`` their log weight, log density at the proposal and acceptance sum;
``ist``/``fst`` the integer and float state; ``pend`` the pending leaf's position and half-step momentum; ``U`` the
uniforms the transition may use, in order.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

ZL, RL, GL, ZR, RR, GR, PSL, PSR, RHO, Z, G = range(11)
NF = 11
MAX_ENERGY_ERROR = 1000.0
PHASE, DEPTH, FWD, K, NSTEP, UI = range(6)        # integer state
H0, ACC, EPS, DIV = range(4)                       # float state
WAIT, ENDED, START, IDLE = 0, 1, 2, 3              # phases

_jit = nb.njit(cache=True)


@_jit
def _merge(nd, sc, old, new, forward, biased, u):
    """``kernel._merge`` of slots ``old`` and ``new`` (its continuation in the direction of travel), into slot
    ``new``; returns whether the merged tree turns."""
    left, right = (old, new) if forward else (new, old)
    ow, nw = sc[old, 0], sc[new, 0]
    hi, lo = (ow, nw) if ow >= nw else (nw, ow)
    logw = hi + math.log1p(math.exp(lo - hi)) if lo > -math.inf else hi
    p = math.exp(min(0.0, nw - ow)) if biased else math.exp(nw - logw)
    take = u < p
    d = nd.shape[2]
    s1 = s2 = s3 = s4 = s5 = s6 = 0.0
    for i in range(d):
        rho = nd[left, RHO, i] + nd[right, RHO, i]
        sa = nd[left, RHO, i] + nd[right, RL, i]
        sb = nd[right, RHO, i] + nd[left, RR, i]
        s1 += nd[left, PSL, i] * rho
        s2 += nd[right, PSR, i] * rho
        s3 += nd[left, PSL, i] * sa
        s4 += nd[right, PSL, i] * sa
        s5 += nd[left, PSR, i] * sb
        s6 += nd[right, PSR, i] * sb
    turning = not (s1 > 0.0 and s2 > 0.0 and s3 > 0.0 and s4 > 0.0 and s5 > 0.0 and s6 > 0.0)
    for i in range(d):                     # each field reads only its own field of the sources: in place is safe
        rho = nd[left, RHO, i] + nd[right, RHO, i]
        zl, rl, gl, psl = nd[left, ZL, i], nd[left, RL, i], nd[left, GL, i], nd[left, PSL, i]
        zr, rr, gr, psr = nd[right, ZR, i], nd[right, RR, i], nd[right, GR, i], nd[right, PSR, i]
        z = nd[new, Z, i] if take else nd[old, Z, i]
        g = nd[new, G, i] if take else nd[old, G, i]
        nd[new, ZL, i], nd[new, RL, i], nd[new, GL, i], nd[new, PSL, i] = zl, rl, gl, psl
        nd[new, ZR, i], nd[new, RR, i], nd[new, GR, i], nd[new, PSR, i] = zr, rr, gr, psr
        nd[new, RHO, i], nd[new, Z, i], nd[new, G, i] = rho, z, g
    sc[new, 1] = sc[new, 1] if take else sc[old, 1]
    sc[new, 0] = logw
    sc[new, 2] = sc[old, 2] + sc[new, 2]
    return turning


@_jit
def _fold(sc, k, level, depth, acc):
    """The acceptance sum of a subtree that turned or diverged at a node of ``level`` summing ``acc``: as the
    recursion returns, each level above whose first half is waiting (bit of ``k`` set) adds that half's sum."""
    for lev in range(level, depth):
        if (k >> lev) & 1:
            acc = sc[1 + lev, 2] + acc
    return acc


@_jit
def _copy_slot(nd, sc, src, dst):
    nd[dst, :, :] = nd[src, :, :]
    sc[dst, :] = sc[src, :]


@_jit
def _start_leaf(c, z, r, g, ist, fst, pend, inv, Zout):
    """The first half of a leapfrog step from ``(z, r, g)``; the new point goes to ``Zout[c]``."""
    eps = fst[c, EPS] if ist[c, FWD] == 1 else -fst[c, EPS]
    half = 0.5 * eps
    for i in range(z.shape[0]):
        rh = r[i] + half * g[i]
        z1 = z[i] + eps * (inv[c, i] * rh)
        pend[c, 0, i] = z1
        pend[c, 1, i] = rh
        Zout[c, i] = z1


@_jit
def _begin_doubling(c, nd, ist, fst, pend, inv, U, Zout):
    ist[c, FWD] = 1 if U[c, ist[c, UI]] < 0.5 else 0
    ist[c, UI] += 1
    ist[c, K] = 0
    t = nd[c, 0]
    if ist[c, FWD] == 1:
        _start_leaf(c, t[ZR], t[RR], t[GR], ist, fst, pend, inv, Zout)
    else:
        _start_leaf(c, t[ZL], t[RL], t[GL], ist, fst, pend, inv, Zout)


@_jit
def _start_transition(c, nd, sc, ist, fst, pend, inv, U, Zout):
    """From slot 0's point with the momentum in slot 0's ``RL`` (the caller's): the initial tree, then the first
    doubling's first leaf."""
    t = nd[c, 0]
    for i in range(t.shape[1]):
        r = t[RL, i]
        ps = inv[c, i] * r
        t[ZL, i] = t[Z, i]
        t[ZR, i] = t[Z, i]
        t[GL, i] = t[G, i]
        t[GR, i] = t[G, i]
        t[RR, i] = r
        t[RHO, i] = r
        t[PSL, i] = ps
        t[PSR, i] = ps
    sc[c, 0, 0] = 0.0
    fst[c, H0] = -sc[c, 0, 1] + 0.5 * np.dot(t[RL], t[PSL])
    fst[c, ACC] = 0.0
    fst[c, DIV] = 0.0
    ist[c, NSTEP] = 0
    ist[c, DEPTH] = 0
    ist[c, PHASE] = WAIT
    _begin_doubling(c, nd, ist, fst, pend, inv, U, Zout)


@_jit
def advance(nd, sc, ist, fst, pend, inv, U, lp_in, g_in, Zout, max_depth, fresh):
    """Chains in phase ``START`` begin their transition; with ``fresh``, every chain in phase ``WAIT`` takes its log
    density ``lp_in[c]`` and gradient ``g_in[c]`` at ``Zout[c]``. Each runs until it asks for its next point (in
    ``Zout[c]``, phase ``WAIT``) or its transition ends (phase ``ENDED``: the draw in slot 0's proposal). Returns
    the number of chains in phase ``ENDED``."""
    nchains, nslots, _, d = nd.shape
    cur = nslots - 1
    for c in range(nchains):
        ph = ist[c, PHASE]
        if ph == START:
            _start_transition(c, nd, sc, ist, fst, pend, inv, U, Zout)
            continue
        if ph != WAIT or not fresh:
            continue
        ndc, scc = nd[c], sc[c]
        eps = fst[c, EPS] if ist[c, FWD] == 1 else -fst[c, EPS]
        half = 0.5 * eps
        lp1 = lp_in[c]
        for i in range(d):                                     # the leaf: the second half step, into slot `cur`
            g1 = g_in[c, i]
            r1 = pend[c, 1, i] + half * g1
            ps = inv[c, i] * r1
            z1 = pend[c, 0, i]
            ndc[cur, ZL, i] = z1
            ndc[cur, ZR, i] = z1
            ndc[cur, Z, i] = z1
            ndc[cur, RL, i] = r1
            ndc[cur, RR, i] = r1
            ndc[cur, RHO, i] = r1
            ndc[cur, GL, i] = g1
            ndc[cur, GR, i] = g1
            ndc[cur, G, i] = g1
            ndc[cur, PSL, i] = ps
            ndc[cur, PSR, i] = ps
        h = -lp1 + 0.5 * np.dot(ndc[cur, RR], ndc[cur, PSR])
        if not math.isfinite(h):
            h = math.inf
        delta = h - fst[c, H0]
        scc[cur, 0] = -delta
        scc[cur, 1] = lp1
        scc[cur, 2] = math.exp(min(0.0, -delta)) if delta == delta else 0.0
        ist[c, NSTEP] += 1
        if delta > MAX_ENERGY_ERROR:
            fst[c, ACC] += _fold(scc, ist[c, K], 0, ist[c, DEPTH], scc[cur, 2])
            ist[c, DEPTH] += 1
            fst[c, DIV] = 1.0
            ist[c, PHASE] = ENDED
            continue
        forward = ist[c, FWD] == 1
        k, t, turning = ist[c, K], 0, False
        while k & 1:                                           # merge the waiting halves (trailing ones of k)
            u = U[c, ist[c, UI]]
            ist[c, UI] += 1
            turning = _merge(ndc, scc, 1 + t, cur, forward, False, u)
            if turning:
                break
            k >>= 1
            t += 1
        if turning:
            fst[c, ACC] += _fold(scc, ist[c, K], t + 1, ist[c, DEPTH], scc[cur, 2])
            ist[c, DEPTH] += 1
            ist[c, PHASE] = ENDED
            continue
        if t == ist[c, DEPTH]:                                 # the subtree is complete: merge it into the tree
            fst[c, ACC] += scc[cur, 2]
            u = U[c, ist[c, UI]]
            ist[c, UI] += 1
            _copy_slot(ndc, scc, cur, 1 + max_depth)           # scratch: the tree merges into slot 0
            turning = _merge(ndc, scc, 0, 1 + max_depth, forward, True, u)
            _copy_slot(ndc, scc, 1 + max_depth, 0)
            ist[c, DEPTH] += 1
            if turning or ist[c, DEPTH] >= max_depth:
                ist[c, PHASE] = ENDED
            else:
                _begin_doubling(c, nd, ist, fst, pend, inv, U, Zout)
        else:
            _copy_slot(ndc, scc, cur, 1 + t)
            ist[c, K] += 1
            if forward:
                _start_leaf(c, ndc[1 + t, ZR], ndc[1 + t, RR], ndc[1 + t, GR], ist, fst, pend, inv, Zout)
            else:
                _start_leaf(c, ndc[1 + t, ZL], ndc[1 + t, RL], ndc[1 + t, GL], ist, fst, pend, inv, Zout)
    ended = 0
    for c in range(nchains):
        ended += ist[c, PHASE] == ENDED
    return ended
