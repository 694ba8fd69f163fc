"""The allreduce cost model's constants fitted to bcl-bench medians (pure Python, no numpy).

Shared by scripts/measure-cost-model.sh (which fits bcl-core's cost.rs constants) and
scripts/sim-validate.sh (which calibrates bcl-sim from runs interleaved with its own).
A time is alpha * steps + beta * bytes sent + gamma * bytes reduced, per algorithm:
"""


def coefficients(p, algo, size):
    """(steps, bytes sent, bytes reduced) of one rank's allreduce of `size` bytes on p ranks."""
    if algo == "ring":
        c = size / p
        return 2 * (p - 1), 2 * (p - 1) * c, (p - 1) * c
    q = 1 << (p.bit_length() - 1)
    k = q.bit_length() - 1
    if algo == "hd":
        share = (q - 1) / q
        a, b, g = 2 * k, 2 * share * size, share * size
    else:
        a, b, g = k, k * size, k * size
    if q != p:
        a, b, g = a + 2, b + 2 * size, g + size
    return a, b, g


def _lstsq(rows, rhs):
    """Least squares by the normal equations (2 or 3 unknowns), Gaussian elimination."""
    n = len(rows[0])
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    atb = [sum(r[i] * y for r, y in zip(rows, rhs)) for i in range(n)]
    for c in range(n):
        piv = max(range(c, n), key=lambda r: abs(ata[r][c]))
        ata[c], ata[piv], atb[c], atb[piv] = ata[piv], ata[c], atb[piv], atb[c]
        for r in range(n):
            if r != c and ata[c][c] != 0:
                f = ata[r][c] / ata[c][c]
                ata[r] = [x - f * y for x, y in zip(ata[r], ata[c])]
                atb[r] -= f * atb[c]
    return [atb[i] / ata[i][i] for i in range(n)]


def fit(keys, med, gamma=None):
    """alpha, beta, gamma fitted on relative error to med[(p, algo, size)]; gamma fixed when given."""
    rows, rhs = [], []
    for k in keys:
        a, b, g = coefficients(*k)
        t = med[k]
        if gamma is None:
            rows.append([a / t, b / t, g / t])
            rhs.append(1.0)
        else:
            rows.append([a / t, b / t])
            rhs.append(1.0 - g * gamma / t)
    sol = _lstsq(rows, rhs)
    return list(sol) + ([] if gamma is None else [gamma])
