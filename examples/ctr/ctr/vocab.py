"""The 26 categorical fields' vocabulary sizes, shared by make_data.py and the model."""

FIELDS = 26  # c1 ... c26
SMALLEST, LARGEST = 10**2, 10**7  # c1's and c26's rows at scale 1
MIN_ROWS = 10  # a scaled-down vocabulary never goes below this


def vocabularies(scale=1.0):
    """Rows of c1 ... c26: log-uniform from 10^2 to 10^7 (as Criteo's fields range from a few
    hundred values to millions), each times ``scale`` (at least MIN_ROWS)."""
    ratio = (LARGEST / SMALLEST) ** (1 / (FIELDS - 1))
    return [max(MIN_ROWS, round(SMALLEST * ratio**k * scale)) for k in range(FIELDS)]
