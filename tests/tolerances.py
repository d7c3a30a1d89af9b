"""How far two float sums of the same numbers may differ: the error bound of summation.

Collective algorithms add the ranks' values in different orders (a ring starts each chunk at
another rank, "hier" sums within a node first, then across nodes); in float16 each addition
rounds to 11 significant bits, so two orders may differ by a rounding of a PARTIAL sum, which
can be far larger than the final value (partial sums near 20, ulp 2^-6 = 0.0156, a result
near 0.4). Any order of n terms, each addition rounded, satisfies (Higham, Accuracy and
Stability of Numerical Algorithms, 4.2):

    |computed - exact| <= gamma_(n-1) * sum_i |x_i|,     gamma_k = k u / (1 - k u)

with u the unit roundoff (2^-11 for float16), so two computed sums are within twice that,
plus a few subnormal steps for results near zero.
"""

import numpy as np


def sum_error_bound(inputs, dtype):
    """Per element: the most two sums of ``inputs`` (rounded in ``dtype``, any orders) may
    differ by."""
    n = len(inputs)
    u = float(np.finfo(dtype).eps) / 2
    gamma = (n - 1) * u / (1 - (n - 1) * u)
    magnitude = np.sum([np.abs(np.asarray(a, np.float64)) for a in inputs], axis=0)
    return 2 * gamma * magnitude + n * float(np.finfo(dtype).smallest_subnormal)
