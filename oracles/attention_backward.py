"""The attention backward oracle: dq, dk, dv of the exact attention, correctly rounded.

Definition (docs/NUMERICS.md section 10). The forward is the exact function of
`oracles/attention.py` (section 3.1): exponents t_ij = c tanh(y_ij / c) + b_ij with
y_ij = sc q_i.k_j (sc = `effective_scale`, c = fl32(softcap), b a float attn_mask's bias; no cap:
t = y + b), P the softmax of t over the keys row i sees, O = P V. With dO the given output
gradient (its exact bits), the oracle returns the exact derivatives, each rounded once to the
input format:

    dP_ij = dO_i . v_j          D_i = sum_j P_ij dP_ij  (= dO_i . O_i, the exact O)
    dT_ij = P_ij (dP_ij - D_i)  gradient of the exponent t_ij
    dS_ij = dT_ij f_ij          f_ij = 1 - tanh^2(y_ij / c) (softcap), else 1: gradient of y_ij
    dq_i = sc sum_j dS_ij k_j   dk_j = sc sum_i dS_ij q_i   dv_j = sum_i P_ij dO_i

GQA/MQA: dk, dv of a key/value head sum over the query heads of its group (the rows of the group
are stacked and summed exactly, before the one rounding). The mask gets no gradient. Varlen is
the caller's: one call per sequence (nothing crosses a sequence boundary).

Special values (section 10.2): a row that sees no key has P = 0: its dq is exactly +0 and it adds
nothing to dk, dv (whatever its q or dO hold); a key no live row sees gets dk = dv = exactly +0.
A forward-NaN row (non-finite q, visible key or bias, as the forward) makes its dq NaN and the
whole dk_j and dv_j of every key j it sees NaN. A non-finite visible value v_j or a non-finite
dO_i (inf counts as NaN, as the forward's q/k) makes dP_i, D_i, dS_i NaN: dq_i NaN, dk_j NaN for
the keys row i sees; dv_j only in the columns d where dO_id is non-finite (dv = P^T dO does not
read v). Exact zeros come out +0.

Two paths, the second certified:

1. Fast path, float64 with a rigorous bound per element (`_fast_group`): the forward's exponents
   (`attention._exponents`: x_j = t_j - t_ref with error err_x), e_j = exp(x_j) within eta_j,
   p^ = e / sum e within rho_j p_j, exact float64 products dO_d v_jd (dP within gamma_Dv sum |.|),
   then D, dP - D, dT, the softcap factor 1/cosh^2(y / c), dS and the three products, each step's
   error propagated in absolute terms (section 10.3). An element is decided when approx +- E round
   alike (value and sign).
2. Exact path, per undecided element (`_ExactGroup`): integer scores and dyadic dP from the inputs'
   integer mantissas. Rational cases are found and computed as Fractions (`round_fraction`): a
   row whose visible keys all share one exact exponent has P = 1/n; a row whose groups of
   equal-exponent keys all have the same mean dP = c has D = c exactly (Lindemann-Weierstrass, as
   in the forward) and dS_ij = 0 wherever dP_ij = c (N = 1, dO_i = 0, equal values); a term with
   a zero factor (q_id, k_jd, dO_id) vanishes; without a softcap sum_j dS_ij = 0, so dq_id may
   subtract a constant from k_.d. An element all of whose terms are rational is computed exactly.
   Every other element goes to Ziv's loop (`round_certified`) on ball arithmetic
   (`oracles/ball.py`: exact dyadic exponents, mpmath exp/cosh/sinh, radii rounded upward), up to
   `MAX_PREC` bits; a value still undecided there raises `UndecidedRounding` rather than guess
   (an exact boundary not recognised above, e.g. two rows' irrational terms cancelling exactly).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from .attention import EXP_REL, U64, _as_f64, _exponents, _int_mantissas, _mask_arrays, effective_scale, visibility
from .ball import Ball, ball_sum
from .formats import Format, format_of, round_float64
from .rounding import UndecidedRounding, round_certified, round_fraction

MAX_PREC = 2048  # Ziv's cap for the backward (a row evaluation at 2^16 bits would take minutes)
_SAFE = 1 + 2.0**-30  # the float64 evaluation of the bounds themselves (sums of positive terms)


@dataclass
class AttentionBackward:
    """The correctly rounded gradients and what a backward bound needs.

    Gradients: dq (B, Hq, M, D), dk (B, Hkv, N, D), dv (B, Hkv, N, Dv), float64 holding values of
    `fmt`; *_approx their float64 approximations (NaN specials kept) and *_err rigorous bounds of
    |approx - exact| (inf where the fast path could not bound an element: the exact path decided
    it). Per query head (B, Hq, M, N): p, dp, ds (gradient of y, softcap factor included),
    dt (gradient of t), factor (1 - tanh^2, or 1), a_raw (sc sum_d |q_id k_jd|), t (exponent
    t_ij), y (sc q_i.k_j), visible; (B, Hq, M): D (sum_j P dP = dO . O), lse; o (B, Hq, M, Dv) the exact O (float64).
    Non-finite inputs are zeroed in these (their effect is in the specials)."""

    fmt: Format
    scale: float
    softcap: float
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray
    dq_approx: np.ndarray
    dk_approx: np.ndarray
    dv_approx: np.ndarray
    dq_err: np.ndarray
    dk_err: np.ndarray
    dv_err: np.ndarray
    dq_special: np.ndarray  # exact specials (NaN, structural zeros): no tolerance
    dk_special: np.ndarray
    dv_special: np.ndarray
    p: np.ndarray
    dp: np.ndarray
    ds: np.ndarray
    dt: np.ndarray
    factor: np.ndarray
    a_raw: np.ndarray
    t: np.ndarray
    y: np.ndarray
    visible: np.ndarray
    D: np.ndarray
    lse: np.ndarray
    o: np.ndarray
    inputs: dict = field(default_factory=dict)  # q, k, v, do (float64, exact) and the call's options
    fallbacks: int = 0
    timing: dict = field(default_factory=dict)

    @property
    def grads(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.dq, self.dk, self.dv


def _gamma(n: int) -> float:
    return n * U64 / (1 - n * U64)


def _fast_group(Q, K, V, dO, vis, sc, cap, bias, ds_rows):
    """Float64 gradients of one key/value head and its stacked query rows Q (R, D), dO (R, Dv),
    with rigorous error bounds. Inputs finite (non-finite entries zeroed by the caller); vis
    (R, N) already holds only live rows (rows with a visible key and a finite forward); ds_rows:
    the rows whose dS enters dq, dk (the others' dS is NaN: their elements are specials)."""
    R, dd = Q.shape
    N, dv = V.shape
    live = vis.any(axis=1)
    out = {}
    x, err_x, t_ref, _err_ref, a, _t_abs, _b_abs = _exponents(Q, K, vis, sc, cap, bias, dd)
    s = Q @ K.T
    A = (np.abs(Q) @ np.abs(K).T) * (1 + 2 * _gamma(dd))
    y = sc * s
    err_y = sc * _gamma(dd) * A + U64 * np.abs(y)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        e = np.where(vis, np.exp(np.where(vis, x, -np.inf)), 0.0)
        eta = np.where(vis, np.expm1(np.minimum(err_x, 50.0)) * (1 + 2.0**-40) + EXP_REL, 0.0)
        l = e.sum(axis=1)
        l_safe = np.where(l > 0, l, 1.0)
        p = e / l_safe[:, None]
        eta_max = eta.max(axis=1) if N else np.zeros(R)
        gN = _gamma(N + 1)
        etabar = ((e * eta).sum(axis=1) / l_safe) * (1 + eta_max) / ((1 - eta_max) * (1 - gN)) * (1 + 2.0**-40)
        rho = ((eta + etabar[:, None] + gN + U64 + eta * U64 + etabar[:, None] * gN)
               / ((1 - etabar[:, None]) * (1 - gN)) * (1 + 2.0**-40))
        ok = live & (eta_max < 1e-3) & (etabar < 1e-3)
        eP = np.where(vis, rho * p / (1 - rho) + 2.0**-1070, 0.0)
        t = np.where(vis, x + t_ref[:, None], 0.0)
        lse = np.where(live, t_ref + np.log(l_safe), -np.inf)

        dP = dO @ V.T  # products exact in float64
        absdP = np.abs(dO) @ np.abs(V).T
        edP = _gamma(dv) * absdP * (1 + 2 * _gamma(dv))
        D = (p * dP).sum(axis=1)
        eD = ((eP * (np.abs(dP) + edP) + p * edP).sum(axis=1) + _gamma(N + 1) * (p * np.abs(dP)).sum(axis=1)) * _SAFE
        diff = dP - D[:, None]
        ediff = edP + eD[:, None] + U64 * np.abs(diff)
        dT = np.where(vis, p * diff, 0.0)
        edT = np.where(vis, eP * (np.abs(diff) + ediff) + p * ediff + U64 * np.abs(dT), 0.0)
        if cap > 0.0:
            z = y / cap
            f = 1.0 / np.cosh(z) ** 2
            lo = np.maximum(np.abs(y) - err_y, 0.0) / cap
            ef = (2.0 / cap) * (err_y + U64 * np.abs(y)) / np.cosh(lo) ** 2 + 16 * U64 * f + 2.0**-1070
            dS = dT * f
            edS = np.where(vis, edT * (f + ef) + np.abs(dT) * ef + U64 * np.abs(dS), 0.0)
        else:
            f = np.ones((R, N))
            dS, edS = dT, edT
        dS = np.where(vis & ds_rows[:, None], dS, 0.0)
        edS = np.where(vis & ds_rows[:, None], edS, 0.0)

        dq = sc * (dS @ K)
        edq = sc * (edS @ np.abs(K) + _gamma(N) * (np.abs(dS) @ np.abs(K))) * _SAFE + U64 * np.abs(dq)
        dk = sc * (dS.T @ Q)
        edk = sc * (edS.T @ np.abs(Q) + _gamma(R) * (np.abs(dS).T @ np.abs(Q))) * _SAFE + U64 * np.abs(dk)
        dvv = p.T @ dO
        edv = (eP.T @ np.abs(dO) + _gamma(R) * (p.T @ np.abs(dO))) * _SAFE
    # Rows the float64 path could not bound: every element they touch is undecided.
    bad = live & ~ok
    edq[bad] = np.inf
    edk[(vis & (bad & ds_rows)[:, None]).any(axis=0)] = np.inf
    edv[vis[bad].any(axis=0)] = np.inf
    for name, val in (("p", p), ("dP", dP), ("D", D), ("dT", dT), ("dS", dS), ("f", np.where(vis, f, 0.0)),
                      ("a_raw", np.where(vis, sc * A, 0.0)), ("t", t), ("y", np.where(vis, y, 0.0)), ("lse", lse),
                      ("dq", dq), ("edq", edq), ("dk", dk), ("edk", edk), ("dv", dvv), ("edv", edv)):
        out[name] = val
    return out


class _ExactGroup:
    """Exact analysis and ball evaluation of one key/value head's stacked rows (finite inputs)."""

    def __init__(self, Q, K, V, dO, vis, sc, cap, bias, fmt):
        self.Q, self.K, self.V, self.dO, self.vis = Q, K, V, dO, vis
        self.sc, self.cap, self.bias, self.fmt = sc, cap, bias, fmt
        qi, eq = _int_mantissas(Q)
        ki, ek = _int_mantissas(K)
        self.scores = qi.dot(ki.T) if Q.size and K.size else np.zeros((Q.shape[0], K.shape[0]), dtype=object)
        sm, se = math.frexp(sc)
        self.sc_fr = Fraction(int(sm * 2**53)) * Fraction(2) ** (se - 53)
        self.unit = self.sc_fr * Fraction(2) ** (eq + ek)  # y_ij = scores_ij * unit exactly
        oi, eo = _int_mantissas(dO)
        vi, ev = _int_mantissas(V)
        dpi = oi.dot(vi.T) if dO.size and V.size else np.zeros((Q.shape[0], K.shape[0]), dtype=object)
        self.dp_unit = Fraction(2) ** (eo + ev)
        self.dp_int = dpi  # dP_ij = dp_int * dp_unit exactly
        self._rows: dict[int, dict] = {}
        self._balls: dict[tuple[int, int], dict] = {}

    def _bias(self, i: int, j: int) -> Fraction:
        return Fraction(0) if self.bias is None else Fraction(float(self.bias[i, j]))

    def row(self, i: int) -> dict:
        """Rational facts of row i: P_ij (Fraction or None), dS_ij (Fraction or None), and whether
        sum_j dS_ij = 0 is known (no softcap)."""
        if i in self._rows:
            return self._rows[i]
        keys = [int(j) for j in np.nonzero(self.vis[i])[0]]
        groups: dict[tuple, list[int]] = {}
        for j in keys:
            groups.setdefault((int(self.scores[i, j]), self._bias(i, j)), []).append(j)
        dP = {j: int(self.dp_int[i, j]) * self.dp_unit for j in keys}
        means = {Fraction(sum((dP[j] for j in g), Fraction(0)), len(g)) for g in groups.values()}
        P: dict[int, Fraction | None] = {j: None for j in keys}
        dS: dict[int, Fraction | None] = {j: None for j in keys}
        factor_one = {j: self.cap == 0.0 or self.scores[i, j] == 0 for j in keys}
        if len(groups) == 1:
            n = len(keys)
            mean = sum(dP.values(), Fraction(0)) / n
            for j in keys:
                P[j] = Fraction(1, n)
                dT = (dP[j] - mean) / n
                if dT == 0:
                    dS[j] = Fraction(0)
                elif factor_one[j]:
                    dS[j] = dT
        elif len(means) == 1:
            c = means.pop()
            for j in keys:
                if dP[j] == c:
                    dS[j] = Fraction(0)
        info = {"keys": keys, "P": P, "dS": dS, "sum0": self.cap == 0.0}
        self._rows[i] = info
        return info

    def exact_dq(self, i: int, d: int) -> Fraction | None:
        info = self.row(i)
        kcol = {j: Fraction(float(self.K[j, d])) for j in info["keys"]}
        unknown = [j for j in info["keys"] if info["dS"][j] is None and kcol[j] != 0]
        if unknown and info["sum0"]:
            kappa = kcol[unknown[0]]  # sum_j dS_ij = 0: shifting k_.d by a constant changes nothing
            kcol = {j: kv - kappa for j, kv in kcol.items()}
            unknown = [j for j in info["keys"] if info["dS"][j] is None and kcol[j] != 0]
        if unknown:
            return None
        return self.sc_fr * sum((info["dS"][j] * kcol[j] for j in info["keys"] if kcol[j] != 0), Fraction(0))

    def _exact_column(self, j: int, factors: np.ndarray, weight: str) -> Fraction | None:
        """sum_i w_ij factors_i over the rows that see key j, w = the rows' exact `weight` ("dS" or
        "P"); None when one that a nonzero factor meets is not rational."""
        total = Fraction(0)
        for i in np.nonzero(self.vis[:, j])[0]:
            f = float(factors[i])
            if f == 0.0:
                continue
            w = self.row(int(i))[weight][j]
            if w is None:
                return None
            total += w * Fraction(f)
        return total

    def exact_dk(self, j: int, d: int) -> Fraction | None:
        total = self._exact_column(j, self.Q[:, d], "dS")
        return None if total is None else self.sc_fr * total

    def exact_dv(self, j: int, d: int) -> Fraction | None:
        return self._exact_column(j, self.dO[:, d], "P")

    def balls(self, i: int, wp: int) -> dict:
        """Row i at working precision wp: {j: (P_ij, dS_ij)} as balls."""
        key = (i, wp)
        if key in self._balls:
            return self._balls[key]
        keys = self.row(i)["keys"]
        if self.cap == 0.0:
            ts = [self.scores[i, j] * self.unit + self._bias(i, j) for j in keys]
            top = max(ts)
            es = [Ball.fraction(tj - top, wp).exp(wp) for tj in ts]  # t - top is dyadic: exact ball
            fs = [None] * len(keys)
        else:
            c = Ball.exact(self.cap)
            tb, fs = [], []
            for j in keys:
                z = Ball.fraction(self.scores[i, j] * self.unit, wp).div(c, wp)
                ch, sh = z.cosh_sinh(wp)
                tb.append(c.mul(sh.div(ch, wp), wp).add(Ball.fraction(self._bias(i, j), wp), wp))
                fs.append(Ball.exact(1).div(ch.mul(ch, wp), wp))
            mids = [float(b.pair()[0]) for b in tb]
            ref = tb[int(np.argmax(mids))]
            es = [b.sub(ref, wp).exp(wp) for b in tb]
        l = ball_sum(es, wp)
        P = [e.div(l, wp) for e in es]
        dP = [Ball.fraction(int(self.dp_int[i, j]) * self.dp_unit, wp) for j in keys]
        D = ball_sum([pj.mul(dj, wp) for pj, dj in zip(P, dP)], wp)
        out = {}
        for n, j in enumerate(keys):
            ds = P[n].mul(dP[n].sub(D, wp), wp)
            if fs[n] is not None:
                ds = ds.mul(fs[n], wp)
            out[j] = (P[n], ds)
        self._balls[key] = out
        return out

    def ball_element(self, kind: str, a: int, d: int, prec: int) -> Ball:
        wp = prec + 2 * max(self.vis.shape).bit_length() + 12
        sc = Ball.exact(self.sc)
        if kind == "dq":
            row = self.balls(a, wp)
            terms = [ds.mul(Ball.exact(float(self.K[j, d])), wp) for j, (_, ds) in row.items()]
            return sc.mul(ball_sum(terms, wp), wp)
        terms = []
        for i in np.nonzero(self.vis[:, a])[0]:
            pij, ds = self.balls(int(i), wp)[a]
            if kind == "dk":
                terms.append(ds.mul(Ball.exact(float(self.Q[i, d])), wp))
            else:
                terms.append(pij.mul(Ball.exact(float(self.dO[i, d])), wp))
        s = ball_sum(terms, wp)
        return sc.mul(s, wp) if kind == "dk" else s

    def element(self, kind: str, a: int, d: int) -> float:
        exact = {"dq": self.exact_dq, "dk": self.exact_dk, "dv": self.exact_dv}[kind](a, d)
        if exact is not None:
            return abs(round_fraction(exact, self.fmt)) if exact == 0 else round_fraction(exact, self.fmt)
        try:
            return round_certified(lambda prec: self.ball_element(kind, a, d, prec).pair(), self.fmt,
                                   max_prec=MAX_PREC)
        except UndecidedRounding as exc:
            raise UndecidedRounding(f"attention backward {kind}[{a}, {d}]: {exc}") from None


def _decide(approx: np.ndarray, err: np.ndarray, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(over="ignore", invalid="ignore"):
        lo = round_float64(approx - err, fmt)
        hi = round_float64(approx + err, fmt)
    ok = (lo == hi) & (np.signbit(lo) == np.signbit(hi)) & np.isfinite(err)
    out = np.where(ok & (lo == 0) & (err == 0), 0.0, lo)  # exact zeros: +0
    return out, ok


def attention_backward_quantities(q, k, v, do, *, causal: bool = False, scale: float | None = None, kv_lens=None,
                                  window=None, softcap: float | None = None, attn_mask=None,
                                  causal_align: str = "top_left", fmt: Format | None = None) -> AttentionBackward:
    """The correctly rounded gradients of q (B, Hq, M, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv) for the
    output gradient do (B, Hq, M, Dv), with P, dP, D, dS and the rest (`AttentionBackward`).
    Tensors of any dtype/layout, or float64 arrays with `fmt` given."""
    t0 = time.perf_counter()
    if fmt is None:
        fmt = format_of(q.dtype)
    fmt = format_of(fmt)
    qf, kf, vf, of = _as_f64(q), _as_f64(k), _as_f64(v), _as_f64(do)
    B, Hq, M, D = qf.shape
    Hkv, N, Dv = kf.shape[1], kf.shape[2], vf.shape[3]
    if of.shape != (B, Hq, M, Dv):
        raise ValueError(f"do has shape {of.shape}, expected {(B, Hq, M, Dv)}")
    G = Hq // Hkv
    sc = effective_scale(scale, D)
    cap = float(np.float32(float(softcap or 0.0)))
    if kv_lens is None:
        lens = [N] * B
    else:
        lens = [int(x) for x in (kv_lens.tolist() if hasattr(kv_lens, "tolist") else kv_lens)]
    allowed, bias = _mask_arrays(attn_mask, (B, Hq, M, N))

    shp4, shpk, shpv = (B, Hq, M, N), (B, Hkv, N, D), (B, Hkv, N, Dv)
    res = {n: np.zeros(shp4) for n in ("p", "dp", "ds", "dt", "factor", "a_raw", "t", "y")}
    vis_all = np.zeros(shp4, dtype=bool)
    Dm, lse = np.zeros((B, Hq, M)), np.full((B, Hq, M), -np.inf)
    o = np.zeros((B, Hq, M, Dv))
    dq, dk, dv = np.zeros(qf.shape), np.zeros(shpk), np.zeros(shpv)
    aq, ak, av = np.zeros(qf.shape), np.zeros(shpk), np.zeros(shpv)
    eq, ek, ev = np.zeros(qf.shape), np.zeros(shpk), np.zeros(shpv)
    sq, sk, sv = np.zeros(qf.shape, bool), np.zeros(shpk, bool), np.zeros(shpv, bool)
    fallbacks = 0
    # No key at all (a varlen sequence of length 0): every row sees none, so dq is a structural +0
    # and dk, dv are empty; the fast path's reference key would be an argmax over nothing.
    sq[:] = N == 0
    for b in range(B if N else 0):
        nv = min(max(lens[b], 0), N)
        base = visibility(M, N, nv, causal, window, causal_align)
        for hk in range(Hkv):
            hs = slice(hk * G, (hk + 1) * G)
            Qs = qf[b, hs].reshape(G * M, D)
            dOs = of[b, hs].reshape(G * M, Dv)
            Kh, Vh = kf[b, hk], vf[b, hk]
            vis = np.broadcast_to(base, (G, M, N)).copy()
            if allowed is not None:
                vis &= allowed[b, hs]
            vis = vis.reshape(G * M, N)
            bias_s = None if bias is None else bias[b, hs].reshape(G * M, N)
            any_vis = vis.any(axis=1)
            q_ok = np.isfinite(Qs).all(axis=1)
            k_ok = np.isfinite(Kh).all(axis=1)
            bad_key = vis & ~k_ok[None, :]
            if bias_s is not None:
                bad_key |= vis & ~np.isfinite(bias_s)
            fwd_nan = any_vis & (~q_ok | bad_key.any(axis=1))
            live = any_vis & ~fwd_nan
            v_rowok = np.isfinite(Vh).all(axis=1)
            do_ok = np.isfinite(dOs)
            ds_nan = any_vis & (fwd_nan | (vis & ~v_rowok[None, :]).any(axis=1) | ~do_ok.all(axis=1))
            lv = vis & live[:, None]
            Q0, K0 = np.where(np.isfinite(Qs), Qs, 0.0), np.where(np.isfinite(Kh), Kh, 0.0)
            V0, dO0 = np.where(np.isfinite(Vh), Vh, 0.0), np.where(do_ok, dOs, 0.0)
            bias0 = None if bias_s is None else np.where(lv, bias_s, 0.0)
            r = _fast_group(Q0, K0, V0, dO0, lv, sc, cap, bias0, ~ds_nan)
            dq_a, dq_e = r["dq"], r["edq"]
            dk_a, dk_e, dv_a, dv_e = r["dk"], r["edk"], r["dv"], r["edv"]
            # specials
            dq_nan = np.broadcast_to(ds_nan[:, None], Qs.shape).copy()
            dk_nan = np.broadcast_to((vis & ds_nan[:, None]).any(axis=0)[:, None], Kh.shape).copy()
            dv_nan = np.broadcast_to((vis & fwd_nan[:, None]).any(axis=0)[:, None], Vh.shape).copy()
            dv_nan |= (lv.T.astype(np.float64) @ (~do_ok).astype(np.float64)) > 0
            dq_zero = ~dq_nan & ~live[:, None]
            seen = lv.any(axis=0)
            dk_zero = ~dk_nan & ~seen[:, None]
            dv_zero = ~dv_nan & ~seen[:, None]
            outs = []
            for a_, e_, nan_, zero_ in ((dq_a, dq_e, dq_nan, dq_zero), (dk_a, dk_e, dk_nan, dk_zero),
                                        (dv_a, dv_e, dv_nan, dv_zero)):
                e_ = np.where(zero_, 0.0, e_)
                a_ = np.where(zero_, 0.0, a_)
                val, ok = _decide(a_, e_, fmt)
                val = np.where(nan_, np.nan, val)
                outs.append([val, ok | nan_ | zero_, np.where(nan_, np.nan, a_), np.where(nan_ | zero_, 0.0, e_),
                             nan_ | zero_])
            todo = [(kind, np.argwhere(~o_[1])) for kind, o_ in zip(("dq", "dk", "dv"), outs)]
            if any(len(t) for _, t in todo):
                # a non-NaN dq_i or dk_j reads no row whose dS is NaN: the live rows serve all three
                ex = _ExactGroup(Q0, K0, V0, dO0, lv, sc, cap, bias0, fmt)
                for n_, (kind, idx) in enumerate(todo):
                    for a_i, d_i in idx:
                        outs[n_][0][a_i, d_i] = ex.element(kind, int(a_i), int(d_i))
                        fallbacks += 1
            dq[b, hs] = outs[0][0].reshape(G, M, D)
            aq[b, hs], eq[b, hs], sq[b, hs] = (x.reshape(G, M, D) for x in outs[0][2:])
            dk[b, hk], ak[b, hk], ek[b, hk], sk[b, hk] = outs[1][0], *outs[1][2:]
            dv[b, hk], av[b, hk], ev[b, hk], sv[b, hk] = outs[2][0], *outs[2][2:]
            vis_all[b, hs] = lv.reshape(G, M, N)
            for name, key in (("p", "p"), ("dp", "dP"), ("ds", "dS"), ("dt", "dT"), ("factor", "f"),
                              ("a_raw", "a_raw"), ("t", "t"), ("y", "y")):
                val = r[key] if key != "dP" else np.where(lv, r[key], 0.0)
                res[name][b, hs] = val.reshape(G, M, N)
            Dm[b, hs] = np.where(live, r["D"], 0.0).reshape(G, M)
            lse[b, hs] = np.where(fwd_nan, np.nan, r["lse"]).reshape(G, M)
            o[b, hs] = (r["p"] @ V0).reshape(G, M, Dv)
    inputs = dict(q=qf, k=kf, v=vf, do=of, causal=causal, scale=scale, kv_lens=kv_lens, window=window,
                  softcap=softcap, attn_mask=attn_mask, causal_align=causal_align)
    return AttentionBackward(fmt=fmt, scale=sc, softcap=cap, dq=dq, dk=dk, dv=dv, dq_approx=aq, dk_approx=ak,
                             dv_approx=av, dq_err=eq, dk_err=ek, dv_err=ev, dq_special=sq, dk_special=sk,
                             dv_special=sv, visible=vis_all, D=Dm, lse=lse, o=o, inputs=inputs,
                             fallbacks=fallbacks, timing={"seconds": time.perf_counter() - t0}, **res)


def attention_backward_oracle(q, k, v, do, *, causal: bool = False, scale: float | None = None, kv_lens=None,
                              window=None, softcap: float | None = None, attn_mask=None,
                              causal_align: str = "top_left",
                              fmt: Format | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dq, dk, dv): the exact gradients of the exact attention, rounded once to the input format
    (float64 arrays). See `attention_backward_quantities` and docs/NUMERICS.md section 10."""
    return attention_backward_quantities(q, k, v, do, causal=causal, scale=scale, kv_lens=kv_lens, window=window,
                                         softcap=softcap, attn_mask=attn_mask, causal_align=causal_align,
                                         fmt=fmt).grads


__all__ = ["AttentionBackward", "MAX_PREC", "attention_backward_oracle", "attention_backward_quantities"]
