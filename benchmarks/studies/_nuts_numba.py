r"""A multinomial NUTS round for C chains compiled with numba: the study kernel of ``nuts_compiled`` (issue 57,
item 2), not the library's.

The same transition as :func:`gpvi.inference.mcmc.kernel.nuts_transition` (multinomial sampling, biased at the top
level, the generalised no-U-turn check on every subtree and across every merge's seam, divergence at an energy error
above 1000, Stan's ``accept_stat``), written as a state machine instead of a recursion: a subtree of depth j is a
binary counter of its 2^j leaves, and after leaf k the pending halves on a stack merge as many times as k has
trailing ones (the order of the recursion's merges and draws). :func:`advance` takes the log density and gradient of
every chain's pending point, runs each chain until it asks for its next point, and writes that point to ``Zout``: one
compiled call a round, the log joint answering all chains at once in between.

Diagonal metric, fixed step size per chain (the sampling phase). Randomness from per-chain buffers of uniforms and
standard normals that the driver refills (not the library's torch streams: the draws differ from ``gpvi.NUTS``'s,
their distribution does not).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

ZL, RL, GL, ZR, RR, GR, PSL, PSR, RHO, Z, G = range(11)
NF = 11
MAX_ENERGY_ERROR = 1000.0
# integer state columns
PHASE, DEPTH, FWD, K, NSTEP, M, UI, NI = range(8)
# float state columns
H0, ACC, EPS, DIV = range(4)
WAIT, DONE, START = 0, 1, 2


@nb.njit(cache=True)
def _merge(nd, sc, old, new, forward, biased, u):
    """Merge ``new`` (the continuation of ``old`` in the direction of travel) into slot ``new``; returns turning."""
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
    for i in range(d):                     # every field reads only its own field of the sources: in place is safe
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
    return turning


@nb.njit(cache=True)
def _copy_slot(nd, sc, src, dst):
    nd[dst, :, :] = nd[src, :, :]
    sc[dst, :] = sc[src, :]


@nb.njit(cache=True)
def _start_leaf(c, z, r, g, ist, fst, pend, inv, Zout):
    eps = fst[c, EPS] if ist[c, FWD] == 1 else -fst[c, EPS]
    half = 0.5 * eps
    for i in range(z.shape[0]):
        rh = r[i] + half * g[i]
        z1 = z[i] + eps * (inv[c, i] * rh)
        pend[c, 0, i] = z1
        pend[c, 1, i] = rh
        Zout[c, i] = z1


@nb.njit(cache=True)
def _begin_doubling(c, nd, ist, fst, pend, inv, U, Zout):
    ist[c, FWD] = 1 if U[c, ist[c, UI]] < 0.5 else 0
    ist[c, UI] += 1
    ist[c, K] = 0
    t = nd[c, 0]
    if ist[c, FWD] == 1:
        _start_leaf(c, t[ZR], t[RR], t[GR], ist, fst, pend, inv, Zout)
    else:
        _start_leaf(c, t[ZL], t[RL], t[GL], ist, fst, pend, inv, Zout)


@nb.njit(cache=True)
def _start_transition(c, nd, sc, ist, fst, pend, inv, sd, U, NRM, Zout):
    t = nd[c, 0]
    d = t.shape[1]
    ni = ist[c, NI]
    kin = 0.0
    for i in range(d):
        r = NRM[c, ni, i] * sd[c, i]
        ps = inv[c, i] * r
        kin += r * ps
        t[ZL, i] = t[Z, i]
        t[ZR, i] = t[Z, i]
        t[GL, i] = t[G, i]
        t[GR, i] = t[G, i]
        t[RL, i] = r
        t[RR, i] = r
        t[RHO, i] = r
        t[PSL, i] = ps
        t[PSR, i] = ps
    ist[c, NI] = ni + 1
    sc[c, 0, 0] = 0.0
    fst[c, H0] = -sc[c, 0, 1] + 0.5 * kin
    fst[c, ACC] = 0.0
    fst[c, DIV] = 0.0
    ist[c, NSTEP] = 0
    ist[c, DEPTH] = 0
    ist[c, PHASE] = WAIT
    _begin_doubling(c, nd, ist, fst, pend, inv, U, Zout)


@nb.njit(cache=True)
def _end_transition(c, nd, sc, ist, fst, pend, inv, sd, U, NRM, Zout, draws, stats, num_draws):
    m = ist[c, M]
    draws[c, m, :] = nd[c, 0, Z, :]
    n = ist[c, NSTEP]
    stats[c, m, 0] = sc[c, 0, 1]
    stats[c, m, 1] = fst[c, ACC] / max(n, 1)
    stats[c, m, 2] = n
    stats[c, m, 3] = ist[c, DEPTH]
    stats[c, m, 4] = fst[c, DIV]
    stats[c, m, 5] = fst[c, H0]
    ist[c, M] = m + 1
    if m + 1 >= num_draws:
        ist[c, PHASE] = DONE
        Zout[c, :] = nd[c, 0, Z, :]
    else:
        _start_transition(c, nd, sc, ist, fst, pend, inv, sd, U, NRM, Zout)


@nb.njit(cache=True)
def advance(nd, sc, ist, fst, pend, inv, sd, U, NRM, lp_in, g_in, Zout, draws, stats, max_depth, num_draws):
    """Take every waiting chain's log density ``lp_in[c]`` and gradient ``g_in[c]`` at ``Zout[c]``, run it to its
    next request (finishing transitions and starting new ones on the way), and write that request to ``Zout[c]``.
    Chains in phase ``START`` begin a transition from slot 0's proposal (its point, log density and gradient)."""
    nchains, nslots, _, d = nd.shape
    cur = nslots - 1
    for c in range(nchains):
        ph = ist[c, PHASE]
        if ph == DONE:
            continue
        if ph == START:
            _start_transition(c, nd, sc, ist, fst, pend, inv, sd, U, NRM, Zout)
            continue
        ndc, scc = nd[c], sc[c]
        eps = fst[c, EPS] if ist[c, FWD] == 1 else -fst[c, EPS]
        half = 0.5 * eps
        lp1 = lp_in[c]
        kin = 0.0
        for i in range(d):                                     # the leaf: the second half step, into slot `cur`
            g1 = g_in[c, i]
            r1 = pend[c, 1, i] + half * g1
            ps = inv[c, i] * r1
            kin += r1 * ps
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
        h = -lp1 + 0.5 * kin
        if not math.isfinite(h):
            h = math.inf
        delta = h - fst[c, H0]
        scc[cur, 0] = -delta
        scc[cur, 1] = lp1
        ist[c, NSTEP] += 1
        if delta == delta:
            fst[c, ACC] += math.exp(min(0.0, -delta))
        if delta > MAX_ENERGY_ERROR:
            ist[c, DEPTH] += 1
            fst[c, DIV] = 1.0
            _end_transition(c, nd, sc, ist, fst, pend, inv, sd, U, NRM, Zout, draws, stats, num_draws)
            continue
        forward = ist[c, FWD] == 1
        k, t, turning = ist[c, K], 0, False
        while k & 1:                                           # merge the pending halves (trailing ones of k)
            u = U[c, ist[c, UI]]
            ist[c, UI] += 1
            turning = _merge(ndc, scc, 1 + t, cur, forward, False, u)
            if turning:
                break
            k >>= 1
            t += 1
        if turning:
            ist[c, DEPTH] += 1
            _end_transition(c, nd, sc, ist, fst, pend, inv, sd, U, NRM, Zout, draws, stats, num_draws)
            continue
        if t == ist[c, DEPTH]:                                 # the subtree is complete: merge it into the tree
            u = U[c, ist[c, UI]]
            ist[c, UI] += 1
            _copy_slot(ndc, scc, cur, 1 + max_depth)           # scratch: the tree merges into slot 0
            turning = _merge(ndc, scc, 0, 1 + max_depth, forward, True, u)
            _copy_slot(ndc, scc, 1 + max_depth, 0)
            ist[c, DEPTH] += 1
            if turning or ist[c, DEPTH] >= max_depth:
                _end_transition(c, nd, sc, ist, fst, pend, inv, sd, U, NRM, Zout, draws, stats, num_draws)
            else:
                _begin_doubling(c, nd, ist, fst, pend, inv, U, Zout)
        else:
            _copy_slot(ndc, scc, cur, 1 + t)
            ist[c, K] += 1
            _start_leaf(c, ndc[1 + t, ZR] if forward else ndc[1 + t, ZL], ndc[1 + t, RR] if forward else
                        ndc[1 + t, RL], ndc[1 + t, GR] if forward else ndc[1 + t, GL], ist, fst, pend, inv, Zout)


def buffers(num_chains: int, d: int, max_depth: int) -> dict[str, np.ndarray]:
    """The state arrays of :func:`advance` for ``num_chains`` chains in ``d`` dimensions: slot 0 the tree, slots
    1..max_depth the pending halves of levels 0..max_depth-1, slot max_depth+1 scratch, the last the new leaf."""
    nslots = max_depth + 3
    return {"nd": np.zeros((num_chains, nslots, NF, d)), "sc": np.zeros((num_chains, nslots, 2)),
            "ist": np.zeros((num_chains, 8), dtype=np.int64), "fst": np.zeros((num_chains, 4)),
            "pend": np.zeros((num_chains, 2, d)), "Zout": np.zeros((num_chains, d))}
